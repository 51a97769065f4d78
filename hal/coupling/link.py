"""The rank-local link between a running numerical model and the learning system.

Every MPI rank of the model holds one :class:`CouplingLink` and calls, once
per model step::

    correction = link.exchange(state, info)   # state: [columns, levels, features]

with its *own* columns only. The link returns a bounded correction
``[columns, levels]`` for exactly those columns, computed by a policy
replica on the rank (the numpy runtime, no JAX) or by a nearby inference
process (``inference=`` endpoint, see :mod:`.coupling_inference`). Each
column is one agent step: its observation is the column's profile with its
context, its action the column's correction. While training, ``info``
carries the target the reward needs (the nudging increment) and the rank
streams its steps to the learner itself (a :class:`~.wire.client.LearnerLink`
of its own, actor id = device id = rank) and takes the learner's weights
itself: nothing passes through rank 0, and ranks with different column
counts need no special shapes.

The shared per-level network. The policy is one small network applied to
every level of every column: level k's input is the profile's features at
levels k-r..k+r (edge levels repeated) followed by the column's context
(:func:`level_inputs`), its output that level's correction. The exported
policy therefore reads one field ``window`` [(2r+1) F + C] and writes one
value ``correction`` [1]; the link builds the windows, so the same export
runs here, in JAX, or in a Fortran model that builds the windows itself.

Failure never hangs the model. Every wait has a deadline; a rank that has
no weights yet (it joined late, or the learner is not up), an inference
process that does not answer in time, a learner that has gone silent for
``peer_timeout_s`` (with ``zero_when_learner_lost``), or a spool that is
full all give a zero correction (or drop the steps) and a logged warning.

Steps are contextual-bandit rows (discount 0): every row is ``terminated``
and carries no successor (no ``final`` rows are sent). Its reward is known
either when it is recorded (the correction scored against ``info["target"]``,
as in nudged training) or ``reward_horizon`` exchanges later: a model that
applies the corrections reports a per-column ``info["score"]`` every
exchange, and a row's reward is the mean score over the next
``reward_horizon`` exchanges (its consequences; :class:`~.batch.HorizonRewards`).
The message schema for other languages is in ``docs/coupling.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..runtime import NumpyPolicy
from ..specs import ArraySpec, DictSpec
from ..steps import NO_POLICY, PolicyVersion, new_episode_id
from ..wire import protocol as P
from ..wire.client import LearnerLink, LinkError
from ..wire.security import ClientKeys
from ..wire.spool import Spool, SpoolFull
from .batch import ColumnBatch, HeldRows, HorizonRewards

log = logging.getLogger(__name__)


class CouplingError(ValueError):
    """A model passed tensors the link cannot use; the message names the field and why."""


@dataclass(frozen=True)
class CouplingConfig:
    levels: int
    """Vertical levels per column (the model's second axis)."""
    features: int
    """Features per level (the model's third axis)."""
    context: int = 0
    """Per-column context values (``info["context"]``: [columns, context])."""
    radius: int = 2
    """Levels on each side in a level's input window."""
    max_correction: float = 1.0
    """Bound of every correction value, in the model's units."""
    learner: str | None = None
    """Learner endpoint to stream steps to and take weights from; None: frozen policy."""
    inference: str | None = None
    """Endpoint of a nearby inference process; None: this rank's own policy replica."""
    secret_key_file: str | None = None
    """This rank's CurveZMQ ``.key_secret`` (``embodyrl keys``); with ``server_key_file``, the link
    to the learner is encrypted and authenticated. Without keys only a loopback learner is dialled."""
    server_key_file: str | None = None
    """The learner's public ``.key``."""
    explore: bool = True
    """Add the policy's exploration noise (training)."""
    stream_fraction: float = 1.0
    """Fraction of the rank's columns streamed per exchange (a random subset)."""
    stream_every: int = 1
    """Stream on every n-th exchange only (its ``stream_fraction`` of the columns; ``info["target"]``
    is read, and checked for non-finite values, on those exchanges only): the rows' fixed cost (a
    dozen array calls on caches the model and other processes have just used) is then paid once per
    n exchanges. ``stream_fraction`` 1 with ``stream_every`` n sends as many rows as 1/n with 1."""
    send_every: int = 1
    """Exchanges whose steps go out together in one STEPS message (fewer, larger messages)."""
    connect_timeout_s: float = 10.0
    """Deadline of the first handshake with the learner; after it the rank goes on without."""
    reconnect_s: float = 5.0
    """While the learner is unreachable, how often to try a short handshake again."""
    inference_timeout_s: float = 1.0
    """Deadline of one inference request."""
    weights_wait_s: float = 0.0
    """How long one exchange may wait for the first weights before answering zero."""
    peer_timeout_s: float = 10.0
    """Silence after which the learner counts as lost."""
    zero_when_learner_lost: bool = True
    """Answer zero corrections (not the stale policy) while the learner is lost."""
    spool_bytes: int = 256 << 20
    """RAM for steps the learner has not acknowledged; beyond it the oldest are dropped."""
    reward_horizon: int = 0
    """0: a row's reward is its correction scored against ``info["target"]``. n > 0: the mean of the
    per-column ``info["score"]`` of the next n exchanges (the model applied the correction and
    reports how its state fares); rows wait on the rank until then."""
    compression: str = "auto"
    """Step batches' compression (``auto``, ``off``, ``zstd``, ``lz4``): the link's CPU against bandwidth."""
    inference_rows: int = 4096
    """Level rows (columns x levels) per call of the policy replica: the per-level network's
    activations for a whole rank at once (49280 rows x 64 x 4 bytes = 12.6 MB for 704 columns)
    would evict the caches the model and the link then run in. 0: the whole rank in one call."""

    @property
    def window(self) -> int:
        """Width of one level's input: (2 radius + 1) features, then the context."""
        return (2 * self.radius + 1) * self.features + self.context

    def observation_spec(self) -> DictSpec:
        """One column step's observation: its profile and its context."""
        specs = [ArraySpec("profile", (self.levels, self.features), np.float32)]
        if self.context:
            specs.append(ArraySpec("context", (self.context,), np.float32))
        return DictSpec.of(*specs)

    def action_spec(self) -> ArraySpec:
        """One column step's action: its bounded correction at every level."""
        b = float(self.max_correction)
        return ArraySpec("correction", (self.levels,), np.float32, -b, b)

    def level_observation_spec(self) -> DictSpec:
        """What the exported per-level policy reads."""
        return DictSpec.of(ArraySpec("window", (self.window,), np.float32))

    def level_action_spec(self) -> ArraySpec:
        b = float(self.max_correction)
        return ArraySpec("correction", (1,), np.float32, -b, b)


def level_inputs(profile: np.ndarray, context: np.ndarray | None, radius: int) -> np.ndarray:
    """[..., levels, (2r+1) F + C]: each level's features at levels k-r..k+r (the
    edge levels repeated beyond the column), then the column's context."""
    levels = profile.shape[-2]
    index = np.clip(np.arange(levels)[:, None] + np.arange(-radius, radius + 1)[None, :], 0, levels - 1)
    window = profile[..., index, :].reshape(*profile.shape[:-2], levels, -1)
    if context is None or context.shape[-1] == 0:
        return window
    ctx = np.broadcast_to(context[..., None, :], (*context.shape[:-1], levels, context.shape[-1]))
    return np.concatenate([window, ctx], axis=-1)


def all_finite(array: np.ndarray) -> bool:
    """Whether every value is finite (a NaN or inf anywhere would reach the policy and the learner)."""
    return bool(np.isfinite(array).all())


def io_threads_cpu_s() -> float | None:
    """CPU seconds of this process's ZeroMQ I/O threads so far (Linux ``/proc``; None elsewhere).

    The link's sockets hand their bytes to these threads, so their CPU is the link's too, though
    the calling thread's clock does not see it. Read from ``schedstat`` (nanoseconds) where the
    kernel keeps it, else from ``stat`` (clock ticks)."""
    import os

    total = 0.0
    try:
        for task in os.scandir("/proc/self/task"):
            with open(f"{task.path}/comm") as f:
                if not f.read().startswith("ZMQbg"):
                    continue
            try:
                with open(f"{task.path}/schedstat") as f:
                    total += int(f.read().split()[0]) * 1e-9
            except FileNotFoundError:
                with open(f"{task.path}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, ValueError, IndexError):
        return None
    return total


@dataclass
class CouplingStats:
    exchanges: int = 0
    link_s: float = 0.0
    """Wall time in the link's own work (checks, steps, sockets, weights), inference excluded."""
    link_cpu_s: float = 0.0
    """The calling thread's CPU time in the same work (``time.thread_time``): what the link cost the
    model's thread, without the time the rank spent descheduled inside ``exchange``."""
    inference_s: float = 0.0
    """Wall time in the policy (the replica or the inference process's round trip)."""
    inference_cpu_s: float = 0.0
    """The process's CPU time in the policy (``time.process_time``: BLAS worker threads included)."""
    zero_answers: int = 0
    steps_sent: int = 0
    steps_dropped: int = 0
    weights_taken: int = 0
    warnings: dict[str, int] = field(default_factory=dict)


class CouplingLink:
    """One rank's end of the coupling (see the module docstring)."""

    POLL_EVERY_S = 1.0
    """While streaming, the learner is polled after a batch goes out when this long has passed since
    the last poll (or when rows wait for credits): its ACKs and weights are not urgent, and each
    poll costs the rank's thread more than the few ACKs it collects."""
    POLL_AT_LEAST_S = 2.0
    """And at least this often, within a batch too (heartbeats, ACKs and weights keep flowing even
    when exchanges stop completing batches)."""

    def __init__(self, config: CouplingConfig, rank: int, policy: NumpyPolicy | None = None,
                 seed: int | None = None):
        for name in ("stream_every", "send_every"):
            if getattr(config, name) < 1:
                raise CouplingError(f"{name}: {getattr(config, name)}; expected a count of at least 1")
        if (policy is None) == (config.inference is None):
            raise CouplingError("give either a policy replica or an inference endpoint, not both or neither")
        if policy is not None:
            want = config.level_observation_spec()
            if policy.observation_spec != want:
                raise CouplingError(f"policy reads {policy.observation_spec}, the link builds {want}")
            if policy.action_spec.shape != (1,):
                raise CouplingError(f"policy action shape {policy.action_spec.shape}; expected (1,)")
        self.config = config
        self.rank = int(rank)
        self.policy = policy
        self.stats = CouplingStats()
        self.observation_spec = config.observation_spec()
        self.action_spec = config.action_spec()
        self._rng = np.random.default_rng(seed)
        self._episodes: np.ndarray | None = None
        self._order = np.empty(0, np.int64)
        """This round's permutation of the columns; ``_picked`` of them have been streamed."""
        self._picked = 0
        self._step_index = 0
        self._link: LearnerLink | None = None
        self._exchanges_in_batch = 0
        self._serviced_at = 0.0
        self._answered = False
        """Whether the last exchange had a policy answer (until then the learner is polled every time)."""
        self._batch = ColumnBatch(config.levels, config.features, config.context, self.rank, config.max_correction)
        self._horizon = HorizonRewards(config.reward_horizon) if config.reward_horizon > 0 else None
        self._spool = Spool(ram_bytes=config.spool_bytes, disk_bytes=config.spool_bytes, on_full="drop_oldest")
        self._next_connect = 0.0
        self._lost_since: float | None = None
        self._inference = None
        if config.inference is not None:
            from .inference import InferenceClient
            self._inference = InferenceClient(config.inference, self.rank, config.inference_timeout_s)
        if config.learner is not None:
            self._connect(config.connect_timeout_s)

    # -- the one call a model makes ---------------------------------------
    def exchange(self, state: np.ndarray, info: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """Corrections [columns, levels] (the state's dtype) for this rank's columns.

        ``info`` may hold ``context`` [columns, context] and, while training,
        ``target`` [columns, levels]: the reward of a column is
        ``-mean(((correction - target) / max_correction) ** 2)``; or, with
        ``reward_horizon``, ``score`` [columns], this state's score (see the
        module docstring).
        """
        start, start_cpu = time.perf_counter(), time.thread_time()
        info = info or {}
        turn = self.stats.exchanges % self.config.stream_every == 0  # a training exchange here streams
        profile, context, target = self._checked(state, info, turn)
        if self._horizon is not None:
            target = self._score_held(info, profile.shape[0])  # not None: this exchange may stream
        sent = self._exchanges_in_batch >= self.config.send_every and self._link is not None
        if sent:  # the last streaming exchange filled the batch
            self._send_pending()
        if self._poll_due(target is not None, sent, start):
            self._service_learner()
        inference_s = inference_thread_s = inference_cpu_s = 0.0
        answer = None
        if self._ready():
            streaming = turn and target is not None and self._link is not None
            if streaming and self._horizon is None:  # the rows' inputs now, while the state is in the
                self._stage(profile, context, target)  # cache; the policy evicts it
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            answer = self._infer(profile, context)
            inference_s, inference_thread_s = time.perf_counter() - t0, time.thread_time() - c0
            inference_cpu_s = time.process_time() - p0
            if streaming and answer is not None:
                if self._horizon is not None:
                    self._hold(profile, context, answer)
                else:
                    self._batch.complete(answer)
                    self._exchanges_in_batch += 1
                self._step_index += 1
        self._answered = answer is not None
        if answer is None:
            answer = np.zeros(profile.shape[:2], np.float32)
            self.stats.zero_answers += 1
        answer = answer.astype(state.dtype, copy=False)
        self.stats.exchanges += 1
        self.stats.inference_s += inference_s
        self.stats.inference_cpu_s += inference_cpu_s
        self.stats.link_s += time.perf_counter() - start - inference_s
        self.stats.link_cpu_s += time.thread_time() - start_cpu - inference_thread_s
        return answer

    @property
    def version(self) -> PolicyVersion:
        return self.policy.version if self.policy is not None else self._inference.version

    @property
    def codec(self) -> str | None:
        """The compression the step batches go out with now (None: raw, or no learner)."""
        return self._link.compression.codec if self._link is not None else None

    def restart(self) -> int:
        """The model starts a new run (another start date): rows still waiting for their horizon's
        scores are dropped (their consequences will not be seen), and the columns get new episode
        ids. Returns the rows dropped."""
        self._episodes = None
        return self._horizon.drop() if self._horizon is not None else 0

    def close(self, flush_s: float = 5.0) -> None:
        """Hand what is spooled to the learner (within ``flush_s``) and close the sockets."""
        if self._link is not None:
            self._send_pending()
            self._link.flush(flush_s)
            self._link.close()
            self._link = None
        if self._inference is not None:
            self._inference.close()

    # -- internals ----------------------------------------------------------
    def _warn(self, kind: str, message: str) -> None:
        """Log the first occurrence of each kind of trouble, and every 100th after it."""
        n = self.stats.warnings.get(kind, 0)
        self.stats.warnings[kind] = n + 1
        if n % 100 == 0:
            log.warning("rank %d: %s (%d times so far)", self.rank, message, n + 1)

    def _checked(self, state, info, target_read: bool = True):
        cfg = self.config
        if not isinstance(state, np.ndarray) or state.dtype not in (np.float32, np.float64):
            raise CouplingError(f"state: a float32 or float64 array, not {type(state).__name__} "
                                f"{getattr(state, 'dtype', '')}")
        if state.ndim != 3 or state.shape[1:] != (cfg.levels, cfg.features):
            raise CouplingError(f"state: shape {state.shape}; expected [columns, {cfg.levels}, {cfg.features}]")
        if not all_finite(state):
            raise CouplingError("state: non-finite values")
        n = state.shape[0]
        context = None
        if cfg.context:
            context = info.get("context")
            if context is None or np.shape(context) != (n, cfg.context):
                raise CouplingError(f"info['context']: shape {np.shape(context)}; expected ({n}, {cfg.context})")
            context = np.asarray(context, np.float32)
            if not all_finite(context):
                raise CouplingError("info['context']: non-finite values")
        target = info.get("target")
        if target is not None:  # kept in its own dtype: only the streamed rows are read
            target = np.asarray(target)
            if target.shape != (n, cfg.levels):
                raise CouplingError(f"info['target']: shape {target.shape}; expected ({n}, {cfg.levels})")
            if target.dtype.kind in "biu":
                target = target.astype(np.float32)
            elif target.dtype.kind != "f":
                raise CouplingError(f"info['target']: dtype {target.dtype}; expected numbers")
            if target_read and not all_finite(target):
                raise CouplingError("info['target']: non-finite values")
        return np.asarray(state, np.float32), context, target

    def _ready(self) -> bool:
        """Whether a policy answer may be used now: weights held, learner not lost."""
        if self.policy is None:
            return True  # the inference process answers with its own version (zero if it has none)
        if self.version == NO_POLICY and self.config.weights_wait_s > 0 and self._link is not None:
            deadline = time.monotonic() + self.config.weights_wait_s
            while self.version == NO_POLICY and time.monotonic() < deadline:
                self._link.poll(10)
                self._take_weights()
        if self.version == NO_POLICY:
            self._warn("no_weights", "no policy weights yet: zero correction")
            return False
        if self._lost_since is not None and self.config.zero_when_learner_lost:
            self._warn("learner_lost", "learner silent: zero correction")
            return False
        return True

    def _infer(self, profile: np.ndarray, context: np.ndarray | None) -> np.ndarray | None:
        if self._inference is not None:
            answer = self._inference.infer(profile, context)
            if answer is None:
                self._warn("inference_timeout", "inference process did not answer in time: zero correction")
            elif self._inference.version == NO_POLICY:
                self._warn("no_weights", "inference process holds no weights yet: zero correction")
                return None
            return answer
        cfg = self.config
        n = profile.shape[0]
        block = max(1, cfg.inference_rows // cfg.levels) if cfg.inference_rows > 0 else n
        if n <= block:
            action, _ = self.policy.act({"window": level_inputs(profile, context, cfg.radius)}, explore=cfg.explore)
            return action[..., 0]
        answer = np.empty(profile.shape[:2], np.float32)
        for lo in range(0, n, block):  # blocks of columns: the activations stay in the cache
            windows = level_inputs(profile[lo:lo + block], None if context is None else context[lo:lo + block],
                                   cfg.radius)
            action, _ = self.policy.act({"window": windows}, explore=cfg.explore)
            answer[lo:lo + block] = action[..., 0]
        return answer

    def _connect(self, timeout_s: float) -> None:
        cfg = self.config
        device = P.DeviceInfo(self.rank, f"rank-{self.rank}", self.observation_spec, self.action_spec)
        keys = None
        if cfg.secret_key_file or cfg.server_key_file:
            if not (cfg.secret_key_file and cfg.server_key_file):
                raise CouplingError("secret_key_file and server_key_file go together")
            keys = ClientKeys(Path(cfg.secret_key_file), Path(cfg.server_key_file))
        link = LearnerLink(cfg.learner, actor_name=f"rank-{self.rank}", actor_id=self.rank, devices=[device],
                           handshake_timeout_s=timeout_s, peer_timeout_s=cfg.peer_timeout_s, spool=self._spool,
                           compression=cfg.compression, keys=keys)
        try:
            link.connect()
        except LinkError as err:
            self._warn("learner_unreachable", f"learner unreachable ({err}); streaming paused")
            self._link = None
            self._lost_since = self._lost_since or time.monotonic()
            self._next_connect = time.monotonic() + cfg.reconnect_s
            return
        self._link = link
        self._lost_since = None

    def _poll_due(self, streaming: bool, sent: bool, now: float) -> bool:
        """Whether to poll the learner in this exchange: always when not streaming (nothing else
        happens on the link) or when the last exchange had no answer; while streaming, after a
        batch went out when ``POLL_EVERY_S`` has passed or rows wait for credits, and at least
        every ``POLL_AT_LEAST_S``."""
        since = now - self._serviced_at
        if not streaming or self._link is None or not self._answered or since > self.POLL_AT_LEAST_S:
            return True  # (no answer last time: no weights yet, or the learner lost)
        return sent and (since > self.POLL_EVERY_S or self._link.unsent_rows > 0)

    def _service_learner(self) -> None:
        """Poll the learner link without waiting; take new weights; track silence."""
        self._serviced_at = time.perf_counter()
        if self.config.learner is None:
            return
        if self._link is None:
            if time.monotonic() >= self._next_connect:
                self._connect(0.05)
            return
        self._link.poll(0)
        self._take_weights()
        if self._link.connected:
            self._lost_since = None
        elif self._lost_since is None:  # the link gave up after peer_timeout_s of silence
            self._lost_since = time.monotonic()

    def _take_weights(self) -> None:
        weights = self._link.take_weights() if self._link is not None else None
        if weights is None:
            return
        if self.policy is not None:
            self.policy.load_weights(*weights)
        self.stats.weights_taken += 1

    def _stage(self, profile, context, target) -> None:
        """Stage this exchange's streamed rows (a random subset of the columns) in the outgoing batch;
        the answer completes them. A batch goes out at the start of the exchange after it fills."""
        cfg = self.config
        rows = self._streamed_rows(profile.shape[0])
        if not self._batch.fits(len(rows)):  # the column count grew within a batch
            self._send_pending()
        self._batch.stage(profile, context, target, rows, self._episodes, self._step_index, self.version,
                          capacity=cfg.send_every * len(rows))

    def _score_held(self, info, n: int) -> np.ndarray:
        """Add this exchange's ``info["score"]`` to the rows waiting for it; commit those complete.
        Returns the score (which stands in for the target: its presence lets this exchange stream)."""
        score = info.get("score")
        if score is None:
            raise CouplingError(f"info['score']: missing; reward_horizon {self.config.reward_horizon} "
                                "needs a score per column every exchange")
        score = np.asarray(score)
        if score.shape != (n,) or score.dtype.kind not in "fiu":
            raise CouplingError(f"info['score']: {score.dtype} shape {score.shape}; expected ({n},) numbers")
        if not all_finite(score):
            raise CouplingError("info['score']: non-finite values")
        for held, reward in self._horizon.score(score.astype(np.float32)):
            if self._link is None:
                continue  # the learner is away: the rows are lost, as streamed rows would be
            if not self._batch.fits(len(held.rows)):
                self._send_pending()
            self._batch.put(held, reward, capacity=self.config.send_every * len(held.rows))
            self._exchanges_in_batch += 1
        return score

    def _hold(self, profile, context, answer) -> None:
        """Gather this exchange's streamed rows with their answers; they wait for their reward."""
        rows = self._streamed_rows(profile.shape[0])
        self._horizon.hold(HeldRows(rows, profile[rows], None if context is None else context[rows],
                                    answer[rows].astype(np.float32), self._episodes[rows], self._step_index,
                                    self.version, np.zeros(len(rows), np.float32)))

    def _streamed_rows(self, n: int) -> np.ndarray:
        """This exchange's streamed columns of the n (:meth:`_pick_rows`); a new column count, or a
        restart, gives every column a new episode id and starts a new round of picks."""
        if self._episodes is None or len(self._episodes) != n:
            self._episodes = np.array([new_episode_id() for _ in range(n)], np.int64)
            self._order, self._picked = np.empty(0, np.int64), 0
        return self._pick_rows(n)

    def _pick_rows(self, n: int) -> np.ndarray:
        """A random ``stream_fraction`` of the n columns, drawn without replacement across exchanges:
        every column is streamed once before any is streamed again (one permutation per round, not
        a fresh draw per exchange)."""
        k = max(1, int(round(self.config.stream_fraction * n)))
        if k >= n:
            return np.arange(n)
        start = self._picked
        if start + k > len(self._order):  # a new round: one permutation, taken k columns at a time
            rest, order = self._order[start:], self._rng.permutation(n)
            if len(rest):  # the last round's rest first, and last again (no pick repeats a column)
                later = np.isin(order, rest)
                order = np.concatenate([rest, order[~later], order[later]])
            self._order, start = order, 0
        self._picked = start + k
        return self._order[start:start + k]

    def _send_pending(self) -> None:
        self._exchanges_in_batch = 0
        steps = self._batch.take()
        if steps is None:
            return
        m = len(steps)
        before = self._link.spool.dropped_rows
        try:
            self._link.send_steps(self.rank, steps)
            self.stats.steps_sent += m
        except SpoolFull:
            self.stats.steps_dropped += m
            self._warn("spool_full", "spool full: steps dropped")
        if self._link.spool.dropped_rows > before:
            self.stats.steps_dropped += self._link.spool.dropped_rows - before
            self._warn("spool_full", "spool full: oldest steps dropped")
