"""The learner service: one loop for every kind of learner, written once.

::

    poll the server         -> new step batches -> data.add  (a resend of rows taken is dropped)
    data.commit()           -> ACK what it made durable: one cumulative ACK per actor
    data.grant_credits()    -> actors may send as fast as training allows (never past the step budget
                               by more than one batch per actor: :class:`WithinBudget`)
    if data.trainable():    -> data.batch() -> training.update (jitted) -> publish every few updates
                               (batches with importance weights: data.reprioritise(TD errors);
                               a step whose loss is not finite is skipped inside the update, and counted)
    every second            -> heartbeats
    every checkpoint_every_s-> checkpoint (state + counters)
    every log_every_s       -> one metrics record: the service's counters and each part's metrics()
    with a console          -> its commands (pause/resume training), a status 4 times a second,
                               each metrics record forwarded

What varies is plugged in. The *data side* (:class:`DataSide`) is the
persistent replay (off-policy; :mod:`.replay_side`), PPO's rollouts
(on-policy, sync or async; :mod:`.rollout_side`) or a coupled model's RAM
ring (:mod:`embodyrl.coupling`). The *training* (:class:`Training`) holds an
algorithm's state and jitted update. The server, the checkpointer and the
metrics sink are passed in too; :func:`~.build.build_learner` assembles the
usual ones from a :class:`~embodyrl.config.TrainConfig`.

The service never waits on one actor: a poll with no training to do waits
at most 10 ms, and with training it does not wait at all.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jax
import numpy as np

from ..algos.scan import SKIPPED
from ..hal import params as flat_params
from ..hal.steps import PolicyVersion, Steps, new_incarnation
from ..transport import LearnerServer, ReceivedSteps
from .devices import Placement
from .episodes import EpisodeReturns
from .hosts import OneHost
from .stages import StageClock

log = logging.getLogger(__name__)


@dataclass
class Counters:
    """What the service counts; saved in every checkpoint and restored with it."""

    env_steps: int = 0
    rows: int = 0
    episodes: int = 0
    updates: int = 0
    """Gradient steps (a PPO iteration counts one)."""
    publications: int = 0
    discarded: int = 0
    """Rows the data side dropped unused (PPO: too stale, or acted before any weights)."""
    rows_behind: int = 0
    """Rows received that were acted by weights older than the learner's current ones."""
    nonfinite_updates_skipped: int = 0
    """Gradient steps skipped because a loss or the new state was not finite (the state kept)."""


class DataSide(Protocol):
    """Where ingested rows go and training batches come from.

    A data side whose batches carry ``weight`` (prioritised replay's importance weights) also
    has ``reprioritise(td_error)``: after each training call the service hands it the update's
    per-sample TD errors (``[K, batch]``), the sampled rows' new priorities.
    """

    def add(self, steps: Steps, seq: int, actor_id: int) -> int:
        """Take a new batch of one device's rows; return how many rows it dropped unused."""

    def commit(self, final: bool = False) -> bool:
        """Make what was added durable when due (always when ``final``, raising if it fails);
        whether anything new became durable."""

    def durable(self) -> Mapping[int, int]:
        """Actor id -> the newest seq that survives a crash (what may be acknowledged)."""

    def grant_credits(self, server: LearnerServer) -> None:
        """Grant actors the rows this side can take now (through ``server.grant``)."""

    def trainable(self) -> bool:
        """Whether :meth:`batch` has a training call's data."""

    def batch(self) -> tuple[Any, dict]:
        """(one training call's batch, metrics of that batch)."""

    def trained(self, updates: int) -> None:
        """``updates`` gradient steps were taken on the last batch."""

    def owed(self) -> int:
        """Gradient steps the rows taken still buy at the update-to-data ratio (0 where training
        follows none): what the learner trains after the step budget is reached."""

    def published(self, version: PolicyVersion) -> int:
        """New weights are out; return the rows this made unusable (dropped)."""

    def restored(self, counters: Counters) -> None:
        """The service resumed from a checkpoint with these counters."""

    def example_batch(self) -> Any | None:
        """A batch shaped as :meth:`batch`'s, to compile the update before actors connect (or None)."""

    def metrics(self) -> dict:
        """This side's figures for the metrics record."""

    def close(self, failed: bool) -> None:
        """Release files and threads (``failed``: the final commit failed; keep the last good one)."""


class PolicyAge:
    """How old the policies that acted the rows are, in gradient steps: for each row taken, the
    learner's updates then minus its updates when it published the row's weights. The measure of
    what the asynchronous path costs a learning run (the synchronous loop's is 0)."""

    KEEP = 4096
    """Publications remembered; a row acted by an older one (a long-spooled batch) is not aged."""

    def __init__(self):
        self._at: dict[int, int] = {}  # publication count -> updates at it
        self._rows: dict[int, int] = {}  # age -> rows, over the start
        self._interval: list[tuple[float, int, int]] = []  # (mean age, max age, rows) per batch since the record

    def published(self, count: int, updates: int) -> None:
        self._at[count] = updates
        if len(self._at) > self.KEEP:
            del self._at[next(iter(self._at))]  # counts only grow: the first is the oldest

    def taken(self, policy_counts: np.ndarray, updates: int) -> None:
        least = policy_counts.min()
        if least == policy_counts.max():  # the common batch: acted by one publication
            self.taken_counts((least,), (len(policy_counts),), updates)
        else:
            self.taken_counts(*np.unique(policy_counts, return_counts=True), updates)

    def taken_counts(self, counts, rows, updates: int) -> None:
        """Rows taken by publication count (``rows[i]`` acted by publication ``counts[i]``): one batch's,
        or what an ingest worker took since its last report."""
        ages = [(updates - self._at[int(c)], int(n)) for c, n in zip(counts, rows, strict=True)
                if int(c) in self._at]
        if not ages:
            return
        for age, n in ages:
            self._rows[age] = self._rows.get(age, 0) + n
        total = sum(n for _, n in ages)
        self._interval.append((sum(a * n for a, n in ages) / total, max(a for a, _ in ages), total))

    def interval(self) -> dict:
        """``policy_age`` (row-weighted mean) and ``policy_age_max`` of the rows taken since the last call."""
        taken, self._interval = self._interval, []
        rows = sum(n for _, _, n in taken)
        if not rows:
            return {"policy_age": None, "policy_age_max": None}
        return {"policy_age": round(sum(m * n for m, _, n in taken) / rows, 2),
                "policy_age_max": max(m for _, m, _ in taken)}

    def distribution(self) -> dict:
        """Rows, mean, percentiles and maximum of the ages of every row taken."""
        return age_distribution(self._rows)

    def rows_by_age(self) -> dict[str, int]:
        """The distribution's counts as a checkpoint keeps them (JSON: the ages as strings)."""
        return {str(age): rows for age, rows in self._rows.items()}

    def resume(self, rows_by_age: Mapping[str, int]) -> None:
        """Go on counting from a checkpoint's counts, so a resumed run's distribution covers it all."""
        for age, rows in rows_by_age.items():
            self._rows[int(age)] = self._rows.get(int(age), 0) + int(rows)


def age_distribution(rows_by_age: Mapping[int, int]) -> dict:
    """``rows``, ``mean``, ``p50``/``p90``/``p99`` and ``max`` of ages given as age -> rows."""
    total = sum(rows_by_age.values())
    if not total:
        return {"rows": 0}
    ages = sorted(rows_by_age)
    cumulative = np.cumsum([rows_by_age[a] for a in ages])

    def percentile(q: float) -> int:
        return int(ages[int(np.searchsorted(cumulative, q * total))])

    return {"rows": int(total), "mean": round(sum(a * rows_by_age[a] for a in ages) / total, 2),
            "p50": percentile(0.5), "p90": percentile(0.9), "p99": percentile(0.99), "max": int(ages[-1])}


def returns_by_kind(by_device: list[tuple[int, float]], kind_names, kind_of: Callable[[int], int]) -> dict:
    """``episode_return/<kind>``: the mean return of each device kind's finished episodes (None: none)."""
    record = {}
    for kind, name in enumerate(kind_names):
        mine = [total for device, total in by_device if kind_of(device) == kind]
        record[f"episode_return/{name}"] = float(np.mean(mine)) if mine else None
    return record


class SkippedSteps:
    """Gradient steps the update skipped (a loss or new state not finite), counted without waiting on
    the device: each call's count is kept as it came back and read at :meth:`fold` (every 256 calls
    at the latest)."""

    def __init__(self):
        self._pending: list = []

    def add(self, metrics: Mapping) -> None:
        if SKIPPED in metrics:
            self._pending.append(metrics[SKIPPED])
            if len(self._pending) >= 256:
                self._pending = [self.fold()]

    def fold(self, wait: bool = True) -> int:
        """The steps skipped since the last fold (``wait`` False: of the calls finished by now, so that a
        metrics record does not hold the loop until the running call ends)."""
        pending, self._pending = self._pending, []
        if not wait:
            done = next((i for i, x in enumerate(pending) if not x.is_ready()), len(pending))
            pending, self._pending = pending[:done], pending[done:]
        return int(round(sum(float(np.sum(x)) for x in jax.device_get(pending)))) if pending else 0


def train_call(data: DataSide, training: Training, skipped: SkippedSteps) -> tuple[dict, dict]:
    """One training call, as every loop trains (the learner service, the synchronous loop): the data
    side's batch, the jitted update, its skipped steps counted, the TD errors back to a prioritised
    replay as the sampled rows' new priorities, the data side told. (update metrics, batch metrics)"""
    batch, batch_metrics = data.batch()
    metrics = training.update(batch)
    skipped.add(metrics)
    if "weight" in batch:
        data.reprioritise(training.own_rows(metrics["td_error"]))
    data.trained(training.updates_per_call)
    return metrics, batch_metrics


class WithinBudget:
    """The server as a data side grants through it while a step budget runs: each grant is cut so
    that the credit outstanding never exceeds ``room`` rows.

    The service makes ``room`` the steps still to take plus ``batch_rows`` (``actor.send_every``)
    per session. Credit is what lets an actor send, so the rows stored end within one batch per
    actor of the budget, however long a training call keeps the service from polling (granted
    quanta would otherwise arrive together past it). It never strands the run short of it: while
    steps remain, the room exceeds what every actor could hold without being able to send a batch.
    """

    def __init__(self, server: LearnerServer, room: int):
        self._server, self.room = server, room
        self.credits, self.sessions = server.credits, server.sessions

    def grant(self, session, credits: int) -> None:
        credits = min(credits, self.room - self.credits.outstanding())
        if credits > 0:
            self._server.grant(session, credits)


class Training:
    """An algorithm's half of the service: its state pytree, jitted update and published weights.

    ``update(state, batch) -> (state, metrics)`` is jitted with the state donated.
    ``actor_params(state)`` is the part actors need; it is published as ``actor/...``.
    """

    def __init__(self, networks, state, update: Callable, actor_params: Callable, *, name: str,
                 updates_per_call: int, publish_every: int, placement: Placement | None = None):
        self.networks, self.name = networks, name
        self.placement = placement or Placement()
        self._update = self.placement.jit(update)
        self.state = self.placement.state(state)
        self._actor_params = actor_params
        self.updates_per_call = updates_per_call
        self.publish_every = publish_every

    @classmethod
    def of(cls, algorithm, observation_spec, action_spec, seed: int, *, updates_per_call: int,
           publish_every: int, placement: Placement | None = None) -> Training:
        """Fresh networks and state of a registered algorithm (``placement``: on several devices, each
        update's batch is split over them, :mod:`embodyrl.learner.devices`)."""
        networks, state = algorithm.init(jax.random.key(seed), observation_spec, action_spec)
        return cls(networks, state, algorithm.make_update_many(networks), algorithm.actor_params,
                   name=algorithm.name, updates_per_call=updates_per_call, publish_every=publish_every,
                   placement=placement)

    def place(self, state):
        """A state restored from a checkpoint, placed as this training keeps it (any device count
        saved it: checkpoints hold this host's plain copy)."""
        return self.placement.state(state)

    def host_state(self):
        """The state as this host holds it (what a checkpoint saves)."""
        return self.placement.local(self.state)

    def update(self, batch) -> dict:
        """One training call on this host's ``batch`` (its share, over several hosts); its metrics."""
        self.state, metrics = self._update(self.state, self.placement.batch(batch))
        return self.placement.local(metrics)

    def own_rows(self, per_row):
        """This host's rows of a per-row result of :meth:`update` (``[calls, batch]``: TD errors)."""
        return self.placement.mine(per_row)

    def compile(self, batch) -> float:
        """Compile the update on ``batch`` with a copy of the state (donated, then dropped); seconds."""
        started = time.monotonic()
        jax.block_until_ready(self._update(jax.tree.map(jax.numpy.copy, self.state), self.placement.batch(batch)))
        return time.monotonic() - started

    def actor_weights(self) -> dict[str, np.ndarray]:
        return flat_params.flatten({"actor": jax.device_get(self.placement.local(self._actor_params(self.state)))})

    def actor_weights_later(self) -> LaterWeights:
        """The actor's weights as the last dispatched call leaves them, read later without waiting on
        calls dispatched since: a device copy, which the next call's donation of the state leaves."""
        return LaterWeights(_device_copy(self._actor_params(self.state)), self.placement)


@jax.jit
def _device_copy(tree):
    """A copy of ``tree`` in new device buffers, in one dispatch."""
    return jax.tree.map(jax.numpy.copy, tree)


class LaterWeights:
    """Actor weights copied on the device, waiting for the call that computes them."""

    def __init__(self, params, placement: Placement):
        self._params, self._placement = params, placement

    def ready(self) -> bool:
        return all(leaf.is_ready() for leaf in jax.tree.leaves(self._params))

    def wait(self) -> None:
        jax.block_until_ready(self._params)

    def get(self) -> dict[str, np.ndarray]:
        """The flat weights, waiting for them if their call is still running."""
        return flat_params.flatten({"actor": jax.device_get(self._placement.local(self._params))})


@dataclass
class DuePublication:
    """A publication due after a training call, sent once its weights are ready (while the next call
    runs): reading them at once would leave the device idle while the loop encodes and sends."""

    weights: LaterWeights
    updates: int
    metrics: Mapping
    batch_metrics: dict


class LearnerService:
    """Serve actors and train: see the module docstring for the loop.

    ``checkpointer``, ``metrics_sink`` and ``save_policy`` may be None (a coupling learner keeps
    no run directory). ``kinds``: (the device kinds' names, device id -> kind index); the metrics
    carry a return per kind (``episode_return/<name>``). ``budget``: env steps to run for (None:
    until stopped); no credit is granted past it but ``batch_rows`` (the actors' ``send_every``)
    per session (:class:`WithinBudget`). ``console``: the operator console's link (:class:`~embodyrl.hal.console.ConsoleLink`):
    it shows the learner's figures and may pause training (ingest, acks and credit go on).
    ``snapshots``: a :class:`~.snapshots.Snapshots` that keeps the policy every ``eval_every`` steps.
    """

    def __init__(self, server: LearnerServer, data: DataSide, training: Training, *,
                 checkpointer=None, metrics_sink=None, save_policy: Callable | None = None,
                 budget: int | None = None, batch_rows: int = 64, incarnation: int | None = None,
                 log_every_s: float = 1.0,
                 checkpoint_every_s: float = 60.0,
                 kinds: tuple[tuple[str, ...], Callable[[int], int]] = ((), int), console=None, hosts=None,
                 snapshots=None):
        self.server, self.data, self.training = server, data, training
        self.snapshots = snapshots
        self.hosts = hosts or OneHost()
        self.console = console
        self.training_paused = False
        self._next_status = 0.0
        self._last_record: dict = {}
        self.checkpointer, self.metrics_sink, self.save_policy = checkpointer, metrics_sink, save_policy
        self.budget, self.batch_rows = budget, batch_rows
        self._elsewhere = 0  # env steps the other hosts had taken at the last turn
        self.incarnation = incarnation if incarnation is not None else new_incarnation()
        self.log_every_s, self.checkpoint_every_s = log_every_s, checkpoint_every_s
        self.kind_names, self.kind_of = kinds
        self.counters = Counters()
        self.stages = StageClock()
        """The loop thread's CPU by intake stage (:mod:`.stages`)."""
        self.train_metrics: dict[str, float] = {}
        self.compile_s: float | None = None
        self._returns = EpisodeReturns()
        self._lag: list[float] = []
        self.policy_age = PolicyAge()
        self._call_s: list[float] = []
        self._skipped = SkippedSteps()
        self._due: DuePublication | None = None
        self._unacked: list[tuple] = []  # (session, seq) taken, waiting for the data side's commit
        self._received: dict[int, int] = {}  # actor id -> newest seq taken (durable or not)
        self._clock = dict.fromkeys(("start", "beat", "checkpoint", "log"), time.monotonic())
        self._updates_at_log = 0
        self._taken_elsewhere = getattr(data, "taken_elsewhere", None)
        """Ingest workers' data side (:mod:`.ingest`): what they took, counted here as taken."""
        self.server.know_incarnations((self.incarnation,))
        self.resumed = checkpointer is not None and checkpointer.latest_step() is not None
        if self.resumed:
            self._restore()
        self.hosts.same("the resumed update count", self.counters.updates)

    # -- identity ----------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def version(self) -> PolicyVersion:
        return PolicyVersion(self.incarnation, self.counters.publications)

    @property
    def state(self):
        return self.training.state

    @state.setter
    def state(self, value) -> None:
        self.training.state = value

    # -- the loop ----------------------------------------------------------
    def warm_up(self) -> None:
        """Compile the update before actors depend on this process answering (a first compile under
        load can outlast their patience); a no-op where the data side has no example batch."""
        example = self.data.example_batch()
        if example is not None:
            self.compile_s = self.training.compile(example)

    def run(self, should_stop: Callable[[], bool] = lambda: False, restart_on_stop: bool = False) -> Counters:
        """Publish, serve until the step budget or ``should_stop()``, then shut down (saves).
        ``restart_on_stop`` (``embodyrl learner``, whose actors run elsewhere): stopped before its
        budget, the learner tells its actors the run goes on, so they dial again and keep their
        spools for the learner started again with ``--resume``; otherwise (``train``, ``launch``:
        the actors are stopped with it) every stop ends the run for them."""
        self.publish()
        complete = False
        try:
            complete = self.serve(should_stop)
        finally:
            restart = restart_on_stop and not complete
            error = self.shutdown("learner stopped before its step budget" if restart else "training complete",
                                  restart=restart)
        if error is not None:  # the loop ended normally, the last commit did not
            raise error
        return self.counters

    def serve(self, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """The loop, without start or shutdown; whether it ended at the step budget (else stopped).
        Over several hosts, each turn's decisions are taken together (:mod:`.hosts`): an update is
        a collective every host must join."""
        wait_ms = 0
        while True:
            self.poll(wait_ms)
            turn = self.hosts.agree(ready=self._may_train(), env_steps=self.counters.env_steps,
                                    stop=should_stop(), checkpoint=self._checkpoint_due())
            self._elsewhere = turn.env_steps - self.counters.env_steps
            if turn.stop:
                return False
            if self.budget is not None and turn.env_steps >= self.budget:
                self._train_owed(should_stop)
                return True
            if turn.checkpoint:
                self.checkpoint()
            if turn.train:
                self.train()
            wait_ms = 0 if turn.train else 10

    def _train_owed(self, should_stop: Callable[[], bool]) -> None:
        """The step budget is reached: train the updates its rows bought that the learner has not
        taken yet (it trails the ratio by up to ``learner.rate_tolerance`` while actors run), so a
        run's final policy has every update its steps paid for, as a synchronous loop's has, short of
        less than one call's (``updates_per_call``). Acks and heartbeats go on meanwhile; a stop
        request ends it. One host only: over several, the run ends where the hosts agree."""
        if self.hosts.count > 1:
            return
        while self.data.owed() >= self.training.updates_per_call and self._may_train() and not should_stop():
            self.train()
            self.poll(0)

    def _may_train(self) -> bool:
        return not self.training_paused and self.data.trainable()

    def poll(self, timeout_ms: int = 0) -> int:
        """Take what arrived, ack what is durable, grant credits, keep time; return rows taken."""
        taken, clock = 0, self.stages
        clock.start()
        batches = self.server.poll(timeout_ms=timeout_ms)
        clock.lap("receive_and_check")
        for batch in batches:
            taken += self._take(batch)
        if self._taken_elsewhere is not None:
            taken += self._count_elsewhere(self._taken_elsewhere())
        clock.lap("store")
        if taken and self.snapshots is not None:  # the run's steps: every host's, as the budget counts them
            self.snapshots.observe(self.counters.env_steps + self._elsewhere, self.counters.updates, self.version,
                                   self.training.actor_weights)
        committed = self.data.commit()
        clock.lap("commit")
        if committed:
            self._ack(self.data.durable())
        self.data.grant_credits(self._granting())
        clock.lap("acks_and_credits")
        if self._due is not None and self._due.weights.ready():  # no call came to send it
            self.send_due()
        self._keep_time()
        clock.lap("upkeep")
        return taken

    def _granting(self):
        """The server, or with a budget the server within it (:class:`WithinBudget`): this host's share
        of the steps still to take (the hosts' last agreed count), plus a batch per session; nothing
        once none are left (the loop ends at its next turn)."""
        if self.budget is None:
            return self.server
        left = self.budget - self._elsewhere - self.counters.env_steps
        if left <= 0:
            return WithinBudget(self.server, 0)
        return WithinBudget(self.server, -(-left // self.hosts.count) + self.batch_rows * self.server.actor_sessions())

    def train(self) -> bool:
        """One training call when the data side has one (and training is not paused); publish when due.
        (Over several hosts, :meth:`serve` calls it only when every host can.)"""
        if not self._may_train():
            return False
        started = time.monotonic()
        metrics, batch_metrics = train_call(self.data, self.training, self._skipped)
        self.send_due()  # the previous call's weights, read and sent while this call runs
        k = self.training.updates_per_call
        before = self.counters.updates
        self.counters.updates += k
        if self.counters.updates // self.training.publish_every > before // self.training.publish_every:
            self._due = DuePublication(self.training.actor_weights_later(), self.counters.updates, metrics,
                                       batch_metrics)
            if getattr(self.data, "on_policy", False):  # its actors wait for these weights
                self.send_due()
        self._call_s.append(time.monotonic() - started)
        return True

    def send_due(self) -> None:
        """Publish the weights a training call made due (waiting for them if need be), if any."""
        due, self._due = self._due, None
        if due is not None:
            self.publish(due.weights.get(), due.updates)
            self.train_metrics = {name: float(np.mean(v)) for name, v in jax.device_get(due.metrics).items()}
            self.train_metrics.update(due.batch_metrics)

    def publish(self, weights: Mapping[str, np.ndarray] | None = None, updates: int | None = None) -> None:
        """Send new weights (``weights`` and ``updates``: those of a call that has run since; default
        the state's now); the data side learns that older ones aged."""
        self.counters.publications += 1
        self.policy_age.published(self.counters.publications, self.counters.updates if updates is None else updates)
        self.counters.discarded += self.data.published(self.version)
        self.server.publish(self.version, self.training.actor_weights() if weights is None else weights)

    def shutdown(self, reason: str, restart: bool = False) -> Exception | None:
        """Log, commit and ack what is left, say goodbye (``restart``: the run goes on, see
        :meth:`LearnerServer.bye`), save, close. A failed final commit is returned (the caller raises
        it once everything is closed), never left to skip the rest."""
        self.send_due()
        self.log(final=True)
        error = None
        try:
            self.data.commit(final=True)
        except Exception as err:  # noqa: BLE001 - returned to be raised after the cleanup
            error = err
        self._ack(self.data.durable())  # only what a commit made durable, failed or not
        self.server.bye(reason if error is None else "learner stopped: replay failed", restart=restart)
        if self._taken_elsewhere is not None:  # ingest workers' last reports, sent as they stopped
            self._count_elsewhere(self._taken_elsewhere())
        if self.save_policy is not None:
            self.save_policy(self.version, self.training.actor_weights())
        if self.checkpointer is not None:
            self.checkpoint()
            self.checkpointer.close()
        if self.metrics_sink is not None:
            self.metrics_sink.close()
        if self.console is not None:
            self.console.publish_status(self.console_status())
            self.console.close()
        self.server.close()
        try:
            self.data.close(failed=error is not None)
        except Exception:
            if error is None:
                raise
        return error

    def _count_skipped(self, wait: bool = True) -> int:
        """Fold the skipped steps of the calls since the last look (``wait`` False: those finished) into
        the counters; return how many."""
        skipped = self._skipped.fold(wait)
        self.counters.nonfinite_updates_skipped += skipped
        if skipped:
            log.warning("skipped %d gradient steps whose loss or new state was not finite (%d in all); "
                        "the state before each was kept", skipped, self.counters.nonfinite_updates_skipped)
        return skipped

    # -- ingest and acks -----------------------------------------------------
    def _take(self, batch: ReceivedSteps) -> int:
        steps, session = batch.steps, batch.session
        self._unacked.append((session, batch.seq))
        if batch.seq <= self._received.get(session.actor_id, 0):  # a resend of rows already taken
            return 0
        self._received[session.actor_id] = batch.seq
        c = self.counters
        c.rows += len(steps)
        c.env_steps += steps.env_steps
        acted = ~steps.final  # a final row holds only an observation: no policy acted it
        mine = steps.policy_incarnation == self.incarnation
        c.rows_behind += int(np.sum(acted & (~mine | (steps.policy_count < c.publications))))
        if (live := acted & mine).any():
            counts = steps.policy_count[live]
            self._lag.append(c.publications - float(counts.mean()))
            self.policy_age.taken(counts, c.updates)
        c.discarded += self.data.add(steps, batch.seq, session.actor_id)
        c.episodes += self._returns.add(steps)
        return len(steps)

    def _count_elsewhere(self, taken) -> int:
        """Count what ingest workers took (:class:`~.ingest.Taken`) as :meth:`_take` counts a batch."""
        c = self.counters
        for name, n in taken.counters.items():
            setattr(c, name, getattr(c, name) + n)
        self._returns.add_finished(taken.finished, taken.rates)
        self._lag.extend(taken.lag)
        if taken.policy_counts:
            counts = sorted(taken.policy_counts)
            self.policy_age.taken_counts(counts, [taken.policy_counts[k] for k in counts], c.updates)
        return taken.counters["rows"]

    def _ack(self, durable: Mapping[int, int]) -> None:
        """One cumulative ACK per session for what ``durable`` (actor id -> seq) covers."""
        waiting, newest = [], {}
        for session, seq in self._unacked:
            if seq <= durable.get(session.actor_id, 0):
                newest[session.identity] = (session, max(seq, newest.get(session.identity, (None, 0))[1]))
            else:
                waiting.append((session, seq))
        for session, seq in newest.values():
            self.server.ack(session, seq)
        self._unacked = waiting

    # -- time-driven work ----------------------------------------------------
    def _keep_time(self) -> None:
        now, clock = time.monotonic(), self._clock
        if now - clock["beat"] >= 1.0:
            self.server.heartbeat()
            clock["beat"] = now
        if now - clock["log"] >= self.log_every_s:
            self.log()
        if self.console is not None:
            self._console_tick(now)

    def _console_tick(self, now: float) -> None:
        """Apply the console's commands; publish the learner's status about 4 times a second."""
        for command in self.console.take_commands():
            if command.action in ("pause_training", "resume_training"):
                self.training_paused = command.action == "pause_training"
                self.console.done(command, True)
            else:
                self.console.done(command, False, f"the learner does not {command.action}")
        if now >= self._next_status:
            self._next_status = now + 0.25
            self.console.publish_status(self.console_status(wait=False))

    def console_status(self, wait: bool = True) -> dict:
        """What the console shows of the learner: progress, speed, version, replay by source, losses
        (``wait`` False: skipped steps counted of the calls finished by now)."""
        self._count_skipped(wait)
        c, record = self.counters, self._last_record
        return {"env_steps": c.env_steps, "budget": self.budget, "updates": c.updates,
                "nonfinite_updates_skipped": c.nonfinite_updates_skipped,
                "updates_per_s": record.get("updates_per_s"), "policy_version": c.publications,
                "policy_age": record.get("policy_age"),
                "training": "paused" if self.training_paused else "running",
                "replay": {"size": record.get("replay_size"), "by_source": record.get("replay_by_source", {})},
                "losses": {k: v for k, v in self.train_metrics.items()
                           if "loss" in k and isinstance(v, (int, float))}}

    def _checkpoint_due(self) -> bool:
        return (self.checkpointer is not None
                and time.monotonic() - self._clock["checkpoint"] >= self.checkpoint_every_s)

    def checkpoint(self) -> None:
        """Save the training state and counters, once per update count."""
        self._clock["checkpoint"] = time.monotonic()
        if self.checkpointer.latest_step() == self.counters.updates:
            return
        self.send_due()  # the publication count saved is the weights' actors have
        self._count_skipped()
        self.checkpointer.save(self.counters.updates, self.training.host_state(), {
            "counters": dataclasses.asdict(self.counters), "incarnation": self.incarnation,
            "incarnations": sorted(self.server.incarnations - {0}), "algorithm": self.training.name,
            "policy_age_rows": self.policy_age.rows_by_age()})

    def _restore(self) -> None:
        """Continue from the newest checkpoint: the state and the counters (publications go on,
        under this start's new incarnation; rows acted under the run's earlier ones are taken)."""
        saved = self.checkpointer.record().get("algorithm")
        if saved is not None and saved != self.training.name:
            raise ValueError(f"{self.checkpointer.directory}: a checkpoint of {saved!r}, "
                             f"not {self.training.name!r}")
        state, record = self.checkpointer.restore(self.training.host_state())
        self.training.state = self.training.place(state)
        self.counters = Counters(**record["counters"])
        self.policy_age.resume(record.get("policy_age_rows", {}))  # absent: a checkpoint from before it
        earlier = record.get("incarnations", [record["incarnation"]] if "incarnation" in record else [])
        self.server.know_incarnations(int(i) for i in earlier)
        self.data.restored(self.counters)

    def log(self, final: bool = False) -> dict:
        """Write one metrics record (to the sink, if any) and return it; the ``final`` one (at shutdown)
        also holds ``policy_age_distribution``, over every row the run took (resumes included)."""
        now = time.monotonic()
        elapsed = now - self._clock["start"]
        since = now - self._clock["log"]
        self._count_skipped(wait=final)
        c = self.counters
        by_device = self._returns.take_finished_by_device()
        returns = [total for _, total in by_device]
        rates = self._returns.take_intervention_rates()
        lag, self._lag = self._lag, []
        call_s, self._call_s = self._call_s, []
        record = {
            "time": round(elapsed, 3), "env_steps": c.env_steps, "episodes": c.episodes,
            "episode_return": float(np.mean(returns)) if returns else None,
            "intervention_rate": float(np.mean(rates)) if rates else None,
            "updates": c.updates,
            "updates_per_s": round((c.updates - self._updates_at_log) / since, 2) if since > 0 else 0.0,
            "policy_version": c.publications, "policy_lag": float(np.mean(lag)) if lag else None,
            **self.policy_age.interval(),
            "rows_behind": c.rows_behind, "discarded": c.discarded,
            "nonfinite_updates_skipped": c.nonfinite_updates_skipped,
            "iteration_s": float(np.mean(call_s)) if call_s else None,
            "batches_awaiting_commit": len(self._unacked),
            **self.server.metrics(elapsed), **self.data.metrics(), **self.train_metrics,
        }
        if final:
            record["policy_age_distribution"] = self.policy_age.distribution()
        if self.compile_s is not None:
            record["compile_s"] = round(self.compile_s, 2)
        record.update(returns_by_kind(by_device, self.kind_names, self.kind_of))  # a curve per device kind
        self._clock["log"], self._updates_at_log = now, c.updates
        if self.metrics_sink is not None:
            self.metrics_sink.write(record, step=c.env_steps)
        self._last_record = record
        if self.console is not None:
            self.console.send_metrics(record)
        return record

