"""Column steps of several exchanges, written straight into one outgoing batch.

A coupled model streams a subset of its columns every exchange and sends
them to the learner every ``send_every`` exchanges. Building a
:class:`~.steps.Steps` per exchange and concatenating them at send time
copied every row twice and allocated a dozen small columns per exchange.
:class:`ColumnBatch` instead allocates the batch once (``send_every``
exchanges' worth of rows) and gathers each exchange's rows into it; the
columns that are the same on every row (the rank, the flags, the source)
are shared read-only arrays, allocated once per batch length. An exchange
fills its rows in two halves: :meth:`ColumnBatch.stage` gathers the inputs
before the policy runs (while the state is still in the cache) and
:meth:`ColumnBatch.complete` adds the answer and the reward after it.

A batch that has been taken is never written again: the wire encodes its
columns without a copy and the spool keeps them until the learner's ACK, so
the next batch gets fresh arrays.

The batch goes out as :class:`WireSteps`, without ``proposed_action``: the
model applies the correction the policy proposed, so the learner's
:meth:`~.steps.Steps.from_arrays` rebuilds it from ``action`` (a fifth of
the bytes a row would otherwise carry).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..steps import SCALAR_COLUMNS, PolicyVersion, Steps

_PER_ROW = ("reward", "episode_id", "step_index", "policy_incarnation", "policy_count")
"""Scalar columns that differ from row to row; the others are constant for a rank's stream."""


class WireSteps(Steps):
    """A coupled model's batch as it goes on the wire: :meth:`arrays` leaves out
    ``proposed_action``, which is ``action`` (nothing alters the policy's correction before the
    model applies it); the receiver's :meth:`Steps.from_arrays` rebuilds it as the same array.
    Hand it to a link, not to a replay (which stores ``proposed_action`` from :meth:`arrays`)."""

    def arrays(self) -> dict[str, np.ndarray]:
        flat = super().arrays()
        del flat["proposed_action"]
        return flat


class ColumnBatch:
    """One rank's outgoing batch of column steps (contextual-bandit rows: all terminated)."""

    def __init__(self, levels: int, features: int, context: int, rank: int, max_correction: float):
        self.levels, self.features, self.context = levels, features, context
        self.rank = int(rank)
        self._reward_weights = np.full(levels, -1.0 / (levels * float(max_correction) ** 2), np.float32)
        self._scratch: dict[np.dtype, np.ndarray] = {}
        """Rows of the staged targets (in their own dtype, no cast) and of the squared errors
        (float32), by dtype; reused, never sent."""
        self._rows = 0
        self._capacity = 0
        self._columns: dict[str, np.ndarray] = {}
        self._staged: tuple[np.ndarray, np.ndarray] | None = None
        self._constant: dict[int, dict[str, np.ndarray]] = {}

    def __len__(self) -> int:
        return self._rows

    def fits(self, rows: int) -> bool:
        """Whether ``rows`` more rows fit the batch being filled (an empty batch fits any)."""
        return self._rows == 0 or self._rows + rows <= self._capacity

    def stage(self, profile: np.ndarray, context: np.ndarray | None, target: np.ndarray, rows: np.ndarray,
              episode_ids: np.ndarray, step_index: int, version: PolicyVersion, capacity: int) -> None:
        """Gather the inputs of one exchange's ``rows`` into the batch; :meth:`complete` adds the
        answer and commits them (an exchange without an answer is simply never completed).

        ``profile`` [n, L, F] float32 and ``context`` [n, C] float32 are the
        checked inputs, ``target`` [n, L] (any float dtype, checked) the
        nudging increment. The first rows of a batch allocate it with room
        for ``capacity`` rows.
        """
        m = len(rows)
        lo, hi = self._room(m, capacity, step_index, version)
        c = self._columns
        np.take(profile, rows, axis=0, out=c["observation/profile"][lo:hi], mode="clip")
        if self.context:
            np.take(context, rows, axis=0, out=c["observation/context"][lo:hi], mode="clip")
        np.take(episode_ids, rows, out=c["episode_id"][lo:hi], mode="clip")
        staged = np.take(target, rows, axis=0, out=self._rows_of(target.dtype, m), mode="clip")
        if staged.dtype != np.float32:  # cast now, while warm (a take that casts into its ``out``
            staged32 = self._rows_of(np.dtype(np.float32), m)  # goes through a buffer: slower, and it warns)
            staged32[...] = staged
            staged = staged32
        self._staged = (rows, staged)

    def complete(self, action: np.ndarray) -> None:
        """Add the answer ``action`` [n, L] float32 to the staged rows, score them, commit them.

        The reward of a row is ``-mean(((action - target) / max_correction) ** 2)``."""
        if self._staged is None:
            raise ValueError("complete() without stage()")
        rows, target = self._staged
        self._staged = None
        lo, hi = self._rows, self._rows + len(rows)
        c = self._columns
        a = np.take(action, rows, axis=0, out=c["action"][lo:hi], mode="clip")
        error = np.subtract(a, target, out=target)  # in the scratch rows: no allocation
        np.square(error, out=error)
        np.matmul(error, self._reward_weights, out=c["reward"][lo:hi])  # -mean(((a - t) / B)^2)
        self._rows = hi

    def add(self, profile: np.ndarray, context: np.ndarray | None, action: np.ndarray, target: np.ndarray,
            rows: np.ndarray, episode_ids: np.ndarray, step_index: int, version: PolicyVersion,
            capacity: int) -> None:
        """:meth:`stage` then :meth:`complete`, for an answer already at hand."""
        self.stage(profile, context, target, rows, episode_ids, step_index, version, capacity)
        self.complete(action)

    def put(self, held: HeldRows, reward: np.ndarray, capacity: int) -> None:
        """Commit rows gathered earlier (:class:`HeldRows`) with their ``reward`` [n] now known."""
        lo, hi = self._room(len(held.action), capacity, held.step_index, held.version)
        c = self._columns
        c["observation/profile"][lo:hi] = held.profile
        if self.context:
            c["observation/context"][lo:hi] = held.context
        c["action"][lo:hi] = held.action
        c["reward"][lo:hi] = reward
        c["episode_id"][lo:hi] = held.episode_ids
        self._rows = hi

    def _room(self, m: int, capacity: int, step_index: int, version: PolicyVersion) -> tuple[int, int]:
        """The slice [lo, hi) of the batch for ``m`` more rows (the first rows of a batch allocate it
        for ``capacity``), stamped with their exchange's step index and policy version."""
        if self._rows == 0:
            self._allocate(max(capacity, m))
        elif self._rows + m > self._capacity:
            raise ValueError(f"{m} rows do not fit: {self._capacity - self._rows} left; take() first")
        lo, hi = self._rows, self._rows + m
        c = self._columns
        c["step_index"][lo:hi] = step_index
        c["policy_incarnation"][lo:hi] = version.incarnation
        c["policy_count"][lo:hi] = version.count
        return lo, hi

    def take(self) -> WireSteps | None:
        """The rows gathered so far as one :class:`WireSteps` (views, no copy); None when empty."""
        if self._rows == 0:
            return None
        n, c = self._rows, self._columns
        const = self._constant_columns(n)
        observation = {"profile": c["observation/profile"][:n]}
        if self.context:
            observation["context"] = c["observation/context"][:n]
        action = c["action"][:n]
        scalars = {name: (c[name][:n] if name in _PER_ROW else const[name]) for name in SCALAR_COLUMNS}
        self._rows, self._capacity, self._columns, self._staged = 0, 0, {}, None
        return WireSteps(observation=observation, action=action, proposed_action=action, **scalars)

    def _rows_of(self, dtype: np.dtype, m: int) -> np.ndarray:
        """``m`` scratch rows of ``dtype`` (grown when needed, then reused)."""
        scratch = self._scratch.get(dtype)
        if scratch is None or len(scratch) < m:
            scratch = self._scratch[dtype] = np.empty((m, self.levels), dtype)
        return scratch[:m]

    def _allocate(self, capacity: int) -> None:
        """Fresh arrays for a new batch (the previous one may still be in the spool)."""
        self._capacity = capacity
        c = {"observation/profile": np.empty((capacity, self.levels, self.features), np.float32),
             "action": np.empty((capacity, self.levels), np.float32)}
        if self.context:
            c["observation/context"] = np.empty((capacity, self.context), np.float32)
        for name in _PER_ROW:
            c[name] = np.empty(capacity, SCALAR_COLUMNS[name])
        self._columns = c

    def _constant_columns(self, n: int) -> dict[str, np.ndarray]:
        """The columns every row shares, for a batch of ``n`` rows (read-only, reused)."""
        if n not in self._constant:
            if len(self._constant) >= 8:  # column counts rarely change; keep a few lengths
                self._constant.clear()
            const = {name: np.zeros(n, dtype) for name, dtype in SCALAR_COLUMNS.items() if name not in _PER_ROW}
            const["terminated"][:] = True
            const["device_id"][:] = self.rank
            const["actor_id"][:] = self.rank
            for array in const.values():
                array.flags.writeable = False
            self._constant[n] = const
        return self._constant[n]


@dataclass
class HeldRows:
    """One exchange's streamed rows, gathered, waiting for their reward."""

    rows: np.ndarray
    profile: np.ndarray
    context: np.ndarray | None
    action: np.ndarray
    episode_ids: np.ndarray
    step_index: int
    version: PolicyVersion
    reward: np.ndarray
    scores: int = 0


class HorizonRewards:
    """Rows whose reward is the mean score of the next ``horizon`` exchanges.

    A correction applied to a free-running model shows its worth only in the
    states that follow. The model reports a score per column at every
    exchange (for example minus the squared error against an analysis); the
    row of exchange t is rewarded ``(score[t+1] + ... + score[t+horizon]) /
    horizon`` and leaves here once that is known. Rows of a run that stops
    earlier are dropped (:meth:`drop`), never sent with a partial reward.
    """

    def __init__(self, horizon: int):
        if horizon < 1:
            raise ValueError(f"horizon: {horizon}; expected at least 1 exchange")
        self.horizon = int(horizon)
        self._held: deque[HeldRows] = deque()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, held: HeldRows) -> None:
        self._held.append(held)

    def score(self, score: np.ndarray) -> list[tuple[HeldRows, np.ndarray]]:
        """Add this exchange's per-column ``score`` to every held row; return the rows now complete
        with their rewards."""
        done = []
        for held in self._held:
            held.reward += score[held.rows]
            held.scores += 1
        while self._held and self._held[0].scores >= self.horizon:
            held = self._held.popleft()
            done.append((held, held.reward / self.horizon))
        return done

    def drop(self) -> int:
        """Forget the rows still waiting (the run they belong to stopped); return how many."""
        dropped = sum(len(h.rows) for h in self._held)
        self._held.clear()
        return dropped
