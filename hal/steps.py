"""The step record: what actors stream and what the replay stores.

Actors stream *steps*, as dm_env's time steps, not (s, a, r, s') rows. Row t
of an episode holds the observation o_t, the action applied at t (after the
safety layer), the action the policy proposed with its log-probability, the
reward r_t and the ``terminated``/``truncated`` flags that followed the
action, and the bookkeeping (episode id, step index, device, actor, the
policy version that acted, the source). An episode ends with one extra row,
``final``, that holds only its last observation. The next observation of row
t is row t+1: an index, never a copy, so an image is stored once.

A batch off the wire is checked for more than its dtypes and finiteness
(:meth:`Steps.from_arrays`): every value must lie within what its task
declares, because one finite but absurd row (a reward of 3e38) makes every
loss after it infinite. The bounds are the specs' own (observation fields
that carry bounds, the applied action's), the task's reward bound
(:data:`REWARD_BOUND` unless the task declares one), a proposed action within
the action's range widened by :data:`PROPOSED_SLACK` ranges, a log-probability
within :data:`LOG_PROB_BOUND`, and step indices and policy counts that a
recorder can write. A refusal names the column, the row and the value.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import secrets
from dataclasses import dataclass, fields
from enum import IntEnum
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .dtypes import is_float
from .journal import RowJournal
from .specs import ArraySpec, DictSpec, SpecError


class Source(IntEnum):
    """Where a step came from; replay can mix and retain by source."""

    ONLINE = 0
    DEMONSTRATION = 1
    INTERVENTION = 2


class PolicyVersion(NamedTuple):
    """(learner incarnation, publication count).

    A restarted learner draws a new incarnation, so versions never repeat;
    staleness is only defined within one incarnation.
    """

    incarnation: int
    count: int

    def staleness(self, latest: PolicyVersion) -> int | None:
        """Publications between this version and ``latest``; None across incarnations."""
        if self.incarnation != latest.incarnation:
            return None
        return latest.count - self.count


NO_POLICY = PolicyVersion(0, -1)
"""The version of actions taken before any learner weights arrived."""


REWARD_BOUND = 1e6
"""The largest |reward| a row may carry unless its task declares its own bound (a robot file's
``task.reward_bound``, a task module's ``REWARD_BOUND``): far beyond any shaped or sparse reward,
far below what makes a squared TD error overflow float32 (3e38 did, in every update after it)."""
LOG_PROB_BOUND = 1e6
"""The largest |log_prob| a row may carry (a density's log, in the action's units)."""
PROPOSED_SLACK = 100.0
"""How far outside the action's bounds a *proposed* action may lie, in widths of the action's range:
the applied action is clipped to the bounds, but the policy's proposal is its sample as drawn (PPO's
Gaussian is not clipped: its log-probability is the sample's), so only the absurd is refused."""


def new_incarnation() -> int:
    """A random non-zero 63-bit learner incarnation id."""
    return secrets.randbits(63) | 1


# Per-row scalar columns and their dtypes; observation and action columns
# take their dtypes from the device's specs.
SCALAR_COLUMNS: dict[str, np.dtype] = {
    "log_prob": np.dtype(np.float32),
    "reward": np.dtype(np.float32),
    "terminated": np.dtype(np.bool_),
    "truncated": np.dtype(np.bool_),
    "final": np.dtype(np.bool_),
    "episode_id": np.dtype(np.int64),
    "step_index": np.dtype(np.int32),
    "device_id": np.dtype(np.int32),
    "actor_id": np.dtype(np.int32),
    "policy_incarnation": np.dtype(np.int64),
    "policy_count": np.dtype(np.int64),
    "source": np.dtype(np.uint8),
}
_SCALAR_SPECS = {name: ArraySpec(name, (), dtype) for name, dtype in SCALAR_COLUMNS.items()}
OBSERVATION_PREFIX = "observation/"


@dataclass(frozen=True)
class Steps:
    """A batch of consecutive rows of one (actor, device) stream, column-wise."""

    observation: dict[str, np.ndarray]
    action: np.ndarray
    proposed_action: np.ndarray
    log_prob: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final: np.ndarray
    episode_id: np.ndarray
    step_index: np.ndarray
    device_id: np.ndarray
    actor_id: np.ndarray
    policy_incarnation: np.ndarray
    policy_count: np.ndarray
    source: np.ndarray

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    @property
    def env_steps(self) -> int:
        """Rows that carry an action (every row but the final ones)."""
        return int(len(self) - np.count_nonzero(self.final))

    def arrays(self) -> dict[str, np.ndarray]:
        """Flat name -> column mapping, as the wire and the replay store it."""
        flat = {OBSERVATION_PREFIX + name: value for name, value in self.observation.items()}
        for name in _FLAT_COLUMNS:
            flat[name] = getattr(self, name)
        return flat

    @classmethod
    def from_arrays(
        cls, arrays: dict[str, np.ndarray], observation_spec: DictSpec, action_spec: ArraySpec, *,
        reward_bound: float = REWARD_BOUND,
    ) -> Steps:
        """Rebuild and validate a batch from flat columns (e.g. off the wire).

        Every column must have its spec's dtype and a common length;
        observations and actions must be finite and applied actions within
        the action bounds; flags must be consistent; and every value within its declared bounds
        (the module docstring: ``reward_bound`` is the task's, :data:`REWARD_BOUND` when it declares
        none). Raises :class:`SpecError` naming the column (and for a value, its row and the value).

        ``proposed_action`` may be absent: it then equals ``action`` and is the
        same array (no copy). A sender whose actions are never changed after
        the policy proposes them (a coupled model) leaves it off the wire.

        A receiver of many batches keeps one :class:`StepsCheck` per device instead (this looks it
        up by the specs, which costs their hashing and comparison on every call).
        """
        return steps_check(observation_spec, action_spec).steps(arrays, reward_bound=reward_bound)


class StepsCheck:
    """The checks of one device's batches, worked out once from its specs: the columns' names,
    dtypes and shapes, their bounds, the tightest of each. :meth:`steps` is
    :meth:`Steps.from_arrays` without looking anything up; a float column's minimum and maximum
    serve both its finiteness (NaN and infinity fail the comparison) and its bounds."""

    def __init__(self, observation_spec: DictSpec, action_spec: ArraySpec):
        self.observation_spec, self.action_spec = observation_spec, action_spec
        self._proposed_spec = dataclasses.replace(action_spec, name="proposed_action")
        self.expected = _expected_columns(observation_spec)
        self._observation_names = tuple((name, OBSERVATION_PREFIX + name) for name in observation_spec)
        bounds = {entry[0]: entry for entry in _bounds_table(observation_spec, action_spec)}
        self._tables = {proposed: self._table(_column_table(observation_spec, action_spec, proposed), bounds)
                        for proposed in (True, False)}

    @staticmethod
    def _table(columns: tuple, bounds: dict) -> tuple:
        """(name, dtype, row shape, tightest lower, tightest upper, whether to test them) per column:
        a spec's bounds; a float column without bounds gets its dtype's largest finite values, so its
        extremes test finiteness; the scalars their own (the reward's lower bound is None: the
        task's bound comes with each call)."""
        table = []
        for name, dtype, shape, floating in columns:
            entry = bounds.get(name)
            lo, hi = (entry[5], entry[6]) if entry is not None else _SCALAR_BOUNDS.get(name, (-np.inf, np.inf))
            if floating and lo is not None:
                largest = float(np.finfo(dtype).max)
                lo, hi = max(lo, -largest), min(hi, largest)
            table.append((name, dtype, shape, lo, hi, floating or entry is not None or name in _SCALAR_BOUNDS))
        return tuple(table)

    def steps(self, arrays: dict[str, np.ndarray], *, reward_bound: float = REWARD_BOUND) -> Steps:
        proposed_absent = "proposed_action" not in arrays
        if proposed_absent:
            arrays = {**arrays, "proposed_action": arrays.get("action")}
        if arrays.keys() != self.expected:
            raise SpecError(
                f"step columns: missing {sorted(self.expected - set(arrays))}, "
                f"unexpected {sorted(set(arrays) - self.expected)}"
            )
        reward = arrays["reward"]
        length = reward.shape[0] if type(reward) is np.ndarray and reward.ndim == 1 else -1
        if length < 1:
            raise SpecError(f"reward: shape {getattr(reward, 'shape', None)}; expected a non-empty 1-d column")
        if not self._fits(arrays, self._tables[not proposed_absent], length, reward_bound):
            arrays = self._checked(arrays, length, proposed_absent)  # names the column at fault
            _check_values(arrays, _bounds_table(self.observation_spec, self.action_spec), arrays["final"])
            _check_scalars(arrays, reward_bound)
            if int(arrays["source"].max()) > _MAX_SOURCE:
                raise SpecError(f"source: unknown tag {int(arrays['source'].max())}")
        final, terminated, truncated = arrays["final"], arrays["terminated"], arrays["truncated"]
        if (final & (terminated | truncated)).any():
            raise SpecError("final rows must not carry terminated/truncated flags")
        if (terminated & truncated).any():
            raise SpecError("a step cannot be both terminated and truncated")
        return Steps(observation={name: arrays[column] for name, column in self._observation_names},
                     action=arrays["action"], proposed_action=arrays["proposed_action"],
                     **{name: arrays[name] for name in SCALAR_COLUMNS})

    @staticmethod
    def _fits(arrays: dict, table: tuple, length: int, reward_bound: float) -> bool:
        """Every column an ndarray of its dtype and shape, and within the tightest of its bounds
        (finite, for a float column): the common case, in two reductions a checked column. False
        sends the batch through the checks that name what is wrong (or find it within the exact,
        per-element, live-row bounds after all)."""
        for name, dtype, shape, lo, hi, checked in table:
            column = arrays[name]
            if type(column) is not np.ndarray or column.dtype != dtype or column.shape[1:] != shape \
                    or column.shape[0] != length:
                return False
            if checked:
                if lo is None:  # the reward: the task's bound, and finite
                    hi = min(reward_bound, _FLOAT32_MAX)
                    lo = -hi
                least, most = extremes(column)
                if not (least >= lo and most <= hi):
                    return False
        return True

    def _checked(self, arrays: dict, length: int, proposed_absent: bool) -> dict:
        checked = dict(arrays)
        for name, spec in _SCALAR_SPECS.items():
            checked[name] = spec.validate_batch(arrays[name], length)
        for name, spec in self.observation_spec.items():
            checked[OBSERVATION_PREFIX + name] = spec.validate_batch(arrays[OBSERVATION_PREFIX + name], length)
        checked["action"] = self.action_spec.validate_batch(arrays["action"], length)
        if not proposed_absent:  # named as its column: the spec's name is the action's
            checked["proposed_action"] = self._proposed_spec.validate_batch(arrays["proposed_action"], length)
        else:
            checked["proposed_action"] = checked["action"]
        return checked


_MAX_SOURCE = int(max(Source))
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_SCALAR_BOUNDS = {"reward": (None, None), "log_prob": (-LOG_PROB_BOUND, LOG_PROB_BOUND),
                  "step_index": (0, np.inf), "policy_count": (NO_POLICY.count, np.inf), "source": (0, _MAX_SOURCE)}
"""What a recorder can write in each scalar column (the reward's bound is the task's: per call)."""


@functools.lru_cache(maxsize=64)
def steps_check(observation_spec: DictSpec, action_spec: ArraySpec) -> StepsCheck:
    return StepsCheck(observation_spec, action_spec)


_FLAT_COLUMNS = tuple(f.name for f in fields(Steps) if f.name != "observation")


@functools.lru_cache(maxsize=64)
def _column_table(observation_spec: DictSpec, action_spec: ArraySpec, proposed: bool = True) -> tuple:
    """(name, dtype, per-row shape, is float) of every column: the hot path's checks, precomputed
    (``proposed``: whether ``proposed_action`` is a column of its own, not ``action`` again)."""
    specs = [(name, spec) for name, spec in _SCALAR_SPECS.items()]
    specs += [(OBSERVATION_PREFIX + name, spec) for name, spec in observation_spec.items()]
    specs += [("action", action_spec)] + ([("proposed_action", action_spec)] if proposed else [])
    return tuple((name, spec.dtype, tuple(spec.shape), is_float(spec.dtype)) for name, spec in specs)


@functools.lru_cache(maxsize=64)
def _bounds_table(observation_spec: DictSpec, action_spec: ArraySpec) -> tuple:
    """(column, lower, upper, live rows only, what the bounds are, the tightest lower and upper bound)
    of every column whose values have bounds to check: observation fields whose spec bounds are
    narrower than their dtype, the applied action, the proposed action (widened by
    :data:`PROPOSED_SLACK`). A bound is None (the tightest: infinite) where it is open."""
    table = []
    for spec in observation_spec.specs:
        lo, hi = _narrower(spec)
        if lo is not None or hi is not None:
            table.append((OBSERVATION_PREFIX + spec.name, lo, hi, False, "its spec's bounds"))
    lo, hi = _narrower(action_spec)
    if lo is not None or hi is not None:  # final rows carry a zero action, within bounds or not
        table.append(("action", lo, hi, True, "the action's bounds"))
        if action_spec.bounded:
            with np.errstate(invalid="ignore", over="ignore"):
                slack = PROPOSED_SLACK * (action_spec.maximum - action_spec.minimum)
            table.append(("proposed_action", _closed(action_spec.minimum - slack), _closed(action_spec.maximum + slack),
                          True, f"the action's bounds widened by {PROPOSED_SLACK:g} times their range"))
    return tuple((*entry, -np.inf if entry[1] is None else float(entry[1].max()),
                  np.inf if entry[2] is None else float(entry[2].min())) for entry in table)


def _narrower(spec: ArraySpec) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``spec``'s bounds, each None where it bounds nothing its dtype could not hold anyway
    (an image's 0..255, a float's infinity)."""
    if spec.dtype.kind in "iu":
        info = np.iinfo(spec.dtype)
        lo = None if spec.minimum is None or (spec.minimum <= info.min).all() else spec.minimum
        hi = None if spec.maximum is None or (spec.maximum >= info.max).all() else spec.maximum
        return lo, hi
    if spec.dtype.kind != "f":  # bool
        return None, None
    return _closed(spec.minimum), _closed(spec.maximum)


def _closed(bound: np.ndarray | None) -> np.ndarray | None:
    """``bound``, or None where no element of it is finite (nothing to check)."""
    return None if bound is None or not np.isfinite(bound).any() else bound


def _check_values(arrays: dict, table: tuple, final: np.ndarray) -> None:
    """Every value within its bounds, else :class:`SpecError` naming the column, row and value. Each
    column costs its minimum and maximum (against the tightest bound) unless something is out."""
    for name, lo, hi, live_only, what, tightest_lo, tightest_hi in table:
        column = arrays[name]
        least, most = extremes(column)
        if least >= tightest_lo and most <= tightest_hi:
            continue  # the common case: every element within the tightest of its bounds
        found = _outside(column, lo, hi, ~final if live_only else None)
        if found is not None:
            row, at, value = found
            low = "-inf" if lo is None else _shown(lo[at])
            high = "inf" if hi is None else _shown(hi[at])
            element = f" element {list(at)}" if at else ""
            raise SpecError(f"{name}: row {row}{element} holds {_shown(value)}, outside [{low}, {high}] "
                            f"({what})")


def _check_scalars(arrays: dict, reward_bound: float) -> None:
    """The per-row scalars' bounds: |reward|, |log_prob|, and the counters a recorder writes."""
    for name, bound in (("reward", reward_bound), ("log_prob", _SCALAR_BOUNDS["log_prob"][1])):
        column = arrays[name]
        least, most = extremes(column)
        if least < -bound or most > bound:
            row = int(np.flatnonzero(np.abs(column) > bound)[0])
            raise SpecError(f"{name}: row {row} holds {_shown(column[row])}, beyond the bound "
                            f"|{name}| <= {_shown(bound)}")
    for name in ("step_index", "policy_count"):
        least_allowed = _SCALAR_BOUNDS[name][0]
        column = arrays[name]
        if extremes(column)[0] < least_allowed:
            row = int(np.flatnonzero(column < least_allowed)[0])
            raise SpecError(f"{name}: row {row} holds {_shown(column[row])}; a recorder never writes "
                            f"less than {least_allowed}")


def extremes(column: np.ndarray) -> tuple:
    """(minimum, maximum) of ``column``, both NaN where it holds a NaN (numpy's reductions carry it;
    so does a sum in Python, whose ``min`` and ``max`` would skip it); a small column's in Python
    (cheaper than two numpy reductions)."""
    if column.size == 0:
        return np.inf, -np.inf  # nothing out of any bound
    if column.size <= 64:
        values = column.ravel().tolist()
        total = sum(values)
        if total != total:
            return math.nan, math.nan
        return min(values), max(values)
    return column.min(), column.max()


def _outside(column: np.ndarray, lo, hi, live: np.ndarray | None) -> tuple[int, tuple, object] | None:
    """(row, index within the row, value) of the first element of ``column`` outside [lo, hi]
    (in a ``live`` row), or None."""
    bad = None
    with np.errstate(invalid="ignore"):
        if lo is not None:
            bad = column < lo
        if hi is not None:
            bad = column > hi if bad is None else bad | (column > hi)
    if bad is None:
        return None
    if live is not None:
        bad &= live.reshape(-1, *(1,) * (column.ndim - 1))
    if not bad.any():
        return None
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return where[0], where[1:], column[where]


def _shown(value) -> str:
    """A value as a refusal names it: an integer in full, a float to 6 significant digits."""
    value = np.asarray(value).item()
    return str(value) if isinstance(value, (int, bool)) else f"{value:.6g}"


def row_nbytes(observation_spec: DictSpec, action_spec: ArraySpec) -> tuple[int, int]:
    """(bytes, columns) of one row on the wire, ``proposed_action`` included: what a receiver
    bounds a batch by before it decodes one."""
    table = _column_table(observation_spec, action_spec)
    return sum(dtype.itemsize * math.prod(shape) for _, dtype, shape, _ in table), len(table)


@functools.lru_cache(maxsize=64)
def _expected_columns(observation_spec: DictSpec) -> frozenset[str]:
    names = {OBSERVATION_PREFIX + n for n in observation_spec} | set(SCALAR_COLUMNS)
    return frozenset(names | {"action", "proposed_action"})


def new_episode_id() -> int:
    """A random 62-bit episode id: unique across actor restarts without coordination."""
    return secrets.randbits(62)


class StepRecorder:
    """Builds :class:`Steps` batches for one (actor, device) stream.

    Call :meth:`add` once per control step with o_t and what followed it,
    :meth:`add_final` with the last observation when the episode ends, and
    :meth:`flush` to take the rows gathered so far. Rows are written into
    preallocated columns, so recording costs a few array stores per step.
    """

    def __init__(self, observation_spec: DictSpec, action_spec: ArraySpec, *,
                 actor_id: int, device_id: int, capacity: int = 256, journal: str | Path | None = None):
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self.actor_id = actor_id
        self.device_id = device_id
        self.capacity = capacity
        self._rows = 0
        self._episode_id = new_episode_id()
        self._step_index = 0
        self._allocate()
        self.journal = RowJournal(journal, self._table.dtype) if journal is not None else None
        """Write-ahead of the rows not yet flushed (:mod:`.journal`), when given a path."""

    def _allocate(self) -> None:
        """One structured row per step, each column a view of it: a row is one contiguous record,
        so the journal writes it with one call."""
        self._table = np.zeros(self.capacity, _recorded_row(self.observation_spec, self.action_spec))
        self._obs = {k: self._table[OBSERVATION_PREFIX + k] for k in self.observation_spec}
        self._action = self._table["action"]
        self._proposed = self._table["proposed_action"]
        self._cols = {name: self._table[name] for name in SCALAR_COLUMNS}

    def __len__(self) -> int:
        return self._rows

    @property
    def episode_id(self) -> int:
        return self._episode_id

    @property
    def step_index(self) -> int:
        return self._step_index

    def _next_row(self) -> int:
        if self._rows == self.capacity:
            raise RuntimeError("StepRecorder is full: flush() before adding more rows")
        row = self._rows
        self._rows += 1
        return row

    def _write_row(self, row: int, observation: dict[str, np.ndarray]) -> None:
        for name, column in self._obs.items():
            column[row] = observation[name]
        c = self._cols
        c["episode_id"][row] = self._episode_id
        c["step_index"][row] = self._step_index
        c["device_id"][row] = self.device_id
        c["actor_id"][row] = self.actor_id

    def add(self, observation, action, proposed_action, reward: float, terminated: bool,
            truncated: bool, version: PolicyVersion, *, log_prob: float = 0.0,
            source: Source = Source.ONLINE) -> None:
        """Record row t: o_t, the applied and proposed actions, and what followed."""
        row = self._next_row()
        self._write_row(row, observation)
        self._action[row] = action
        self._proposed[row] = proposed_action
        c = self._cols
        c["log_prob"][row] = log_prob
        c["reward"][row] = reward
        c["terminated"][row] = terminated
        c["truncated"][row] = truncated
        c["final"][row] = False
        c["policy_incarnation"][row] = version.incarnation
        c["policy_count"][row] = version.count
        c["source"][row] = source
        self._step_index += 1
        self._journal_row(row)

    def add_final(self, observation) -> None:
        """Close the episode with the row that holds only its last observation."""
        row = self._next_row()
        self._write_row(row, observation)
        self._action[row] = 0
        self._proposed[row] = 0
        c = self._cols
        for name in ("log_prob", "reward", "terminated", "truncated",
                     "policy_incarnation", "policy_count", "source"):
            c[name][row] = 0
        c["final"][row] = True
        self._episode_id = new_episode_id()
        self._step_index = 0
        self._journal_row(row)

    def _journal_row(self, row: int) -> None:
        if self.journal is not None:
            self.journal.append(self._table[row:row + 1])

    def abandon_episode(self) -> None:
        """Start a new episode without a final row (the old one was interrupted).

        Its last row keeps no successor, so the replay never samples it as a
        transition start; everything before it stays valid.
        """
        self._episode_id = new_episode_id()
        self._step_index = 0

    def flush(self) -> Steps | None:
        """Take the rows recorded since the last flush (None if there are none)."""
        if self._rows == 0:
            return None
        steps = steps_from_table(self._table[:self._rows], self.observation_spec)
        self._rows = 0
        return steps

    def recovered(self) -> Steps | None:
        """The rows a previous process recorded and never spooled (its journal), if any."""
        rows = self.journal.recovered if self.journal is not None else ()
        return steps_from_table(rows, self.observation_spec) if len(rows) else None

    def spooled(self) -> None:
        """The rows flushed so far are in the spool: the journal forgets them."""
        if self.journal is not None:
            self.journal.clear()


def _recorded_row(observation_spec: DictSpec, action_spec: ArraySpec) -> np.dtype:
    """A recorded row: every column by its wire name (:meth:`Steps.arrays`), as a structured dtype (the
    replay's row, :func:`embodyrl.replay.layout.row_dtype`, adds its links and padding)."""
    return np.dtype([(name, dtype, shape) for name, dtype, shape, _ in _column_table(observation_spec, action_spec)],
                    align=True)


def steps_from_table(table: np.ndarray, observation_spec: DictSpec) -> Steps:
    """A :class:`Steps` of contiguous copies of a structured table's columns."""
    column = {name: table[name].copy() for name in table.dtype.names}
    return Steps(observation={k: column[OBSERVATION_PREFIX + k] for k in observation_spec},
                 **{name: column[name] for name in ("action", "proposed_action", *SCALAR_COLUMNS)})


_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a well-mixed 64-bit hash of each element."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def rows_digest(columns) -> int:
    """An order-independent 64-bit digest of a batch's row identities.

    ``columns`` is a :class:`Steps` or a mapping with ``actor_id``,
    ``device_id``, ``episode_id`` and ``step_index``. Digests add (mod 2**64),
    so the digest of everything an actor sent is the sum of its batches',
    and a row stored twice or not at all changes it: the exact-once check of
    an actor's ledger against the replay (``embodyrl replay DIR``).
    """
    get = columns.get if hasattr(columns, "get") else lambda name: getattr(columns, name)
    with np.errstate(over="ignore"):
        ident = (np.asarray(get("actor_id")).astype(np.uint64) << np.uint64(40)) ^ \
            (np.asarray(get("device_id")).astype(np.uint64) << np.uint64(32)) ^ \
            np.asarray(get("step_index")).astype(np.uint32).astype(np.uint64)
        hashed = _splitmix(_splitmix(np.asarray(get("episode_id")).astype(np.uint64)) ^ ident)
        return int(hashed.sum(dtype=np.uint64))
