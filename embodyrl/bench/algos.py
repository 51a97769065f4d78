"""``embodyrl bench algos``: the learner's loop against the bare jitted update it runs.

``learner_loop_ratio``: gradient steps per second of a real learner over the
same jitted update called back to back on a batch already on the device, in
short alternating blocks of one run (each rate over all its blocks).
The learner is the :class:`~embodyrl.learner.LearnerService` that ``embodyrl
train`` builds (:func:`~embodyrl.learner.make_learner`) for the pendulum with
DDPG at the task's defaults (256x256, batch 256, K=16 updates per call,
``updates_per_step`` 1, weights published every 32 updates, metrics every
second), in a temporary run directory. A separate process feeds it over the
real wire through the actor's link (:class:`~embodyrl.hal.wire.client.LearnerLink`:
HELLO, STEPS within credit, ACKs, weights) with a pre-made batch of 64 rows
(an actor's ``send_every``), so no simulator sets the pace: the learner does,
through the credits that hold the update-to-data ratio. Everything that
shares the loop's thread is on the clock: ingest, group commit, acks and
credits, sampling, the update, publishing. The loop runs the bare update and
more, so the ratio cannot exceed 1: above 1, ``learner_loop_bench_bug`` says so.
Goal: at least 0.95 (``learner_loop_goal_met``).

``learner_loop_share_*``: where the loop's wall time goes, from timers the
bench puts around the service's phases (the service is unchanged):

* ``ingest``: receiving and validating STEPS, appending rows to the replay;
* ``commit``: starting the replay's group commit when due (its syncs run on
  the committer thread), acks, credits;
* ``sample``: taking a training call's batches from the sampling thread;
* ``update``: dispatching the jitted update and waiting for it to finish
  where the loop reads its result (before publishing, at a block's end: JAX
  runs the update asynchronously, so its cost is met there);
* ``publish``: reading the actor's weights, encoding and sending them;
* ``housekeeping``: heartbeats, the metrics record, checkpoints;
* ``starved``: polls that waited because the ratio allowed no training call
  (the feeder, not the learner, was the limit); ``other``: the rest (the
  loop's own bookkeeping). The shares sum to 1.

``learner_loop_update_vs_bare``: the loop's update phase per gradient step
over the bare update's; above 1, the update itself ran slower in the loop
(the sampling thread, ZeroMQ's and the feeder share the machine's cores).
``learner_loop_updates_per_row``: gradient steps per row ingested over the
measured blocks, which the credits hold to ``updates_per_step`` (to within
a credit grant of 256 rows).

``sharded_updates_per_s``: the same update split over 1, 2 and 4 forced CPU devices
(``learner.devices``), side by side in one child process, with each count's rate over one
device's as ``sharded_vs_one_device_N`` (:mod:`embodyrl.bench.devices` says what these show
and what they cannot: forced devices share this machine's cores).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import numpy as np

from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import PolicyVersion, StepRecorder
from . import devices

ROWS_PER_BATCH = 64  # an actor's send_every
FEED_INCARNATION = 7  # the feeder acts under an earlier learner of the run, which the learner is told of
PHASES = ("ingest", "commit", "sample", "update", "publish", "housekeeping", "starved")


def _premade(obs_spec: DictSpec, action_spec: ArraySpec, rows: int):
    """One batch of ``rows`` steps with values inside the specs' bounds."""
    rng = np.random.default_rng(0)

    def value(spec: ArraySpec) -> np.ndarray:
        if spec.bounded:
            return rng.uniform(spec.minimum, spec.maximum).astype(spec.dtype)
        return rng.normal(size=spec.shape).astype(spec.dtype)

    rec = StepRecorder(obs_spec, action_spec, actor_id=0, device_id=0, capacity=rows)
    for _ in range(rows):
        a = value(action_spec)
        rec.add({k: value(s) for k, s in obs_spec.items()}, a, a, float(rng.normal()), False, False,
                PolicyVersion(FEED_INCARNATION, 1))  # an earlier learner's weights: acted, never forged
    return rec.flush()


def _feed(endpoint: str, device: str, obs_msg, action_msg, stop) -> None:
    """The feeding actor (spawned): send the pre-made batch whenever credit allows, until ``stop``
    or the learner's BYE."""
    from ..hal.wire.client import LearnerLink
    from ..hal.wire.protocol import DeviceInfo

    obs_spec, action_spec = DictSpec.from_msg(obs_msg), ArraySpec.from_msg(action_msg)
    steps = _premade(obs_spec, action_spec, ROWS_PER_BATCH)
    link = LearnerLink(endpoint, actor_name="bench-feeder", actor_id=0, handshake_timeout_s=300,
                       devices=[DeviceInfo(0, device, obs_spec, action_spec)])
    link.connect()
    try:
        while not stop.is_set() and link.bye_reason is None:
            if link.credits >= ROWS_PER_BATCH:
                link.send_steps(0, steps)
                link.poll(0)
            else:
                link.poll(5)
    finally:
        link.close()


class _Phases:
    """Seconds of the loop's wall time per phase, from timers put around the service's parts."""

    def __init__(self, learner):
        self.spent = dict.fromkeys(PHASES, 0.0)
        server, data, training = learner.server, learner.data, learner.training
        self.bare_update = training.update  # the same jitted function, untimed
        poll = server.poll

        def timed_poll(timeout_ms: int = 0, **kwargs):
            started = time.perf_counter()
            try:
                return poll(timeout_ms, **kwargs)
            finally:  # a poll allowed to wait: the loop had no training call to make
                self.spent["starved" if timeout_ms else "ingest"] += time.perf_counter() - started

        send_due = learner.send_due

        def timed_send_due() -> None:
            due = learner._due
            if due is None:
                return
            started = time.perf_counter()
            due.weights.wait()  # the update's cost, met where its result is read
            ready = time.perf_counter()
            send_due()
            self.spent["update"] += ready - started
            self.spent["publish"] += time.perf_counter() - ready

        server.poll, learner.send_due = timed_poll, timed_send_due
        learner._take = self._timed(learner._take, "ingest")
        learner._ack = self._timed(learner._ack, "commit")
        learner._keep_time = self._timed(learner._keep_time, "housekeeping")
        data.commit = self._timed(data.commit, "commit")
        data.grant_credits = self._timed(data.grant_credits, "commit")
        data.batch = self._timed(data.batch, "sample")
        training.update = self._timed(training.update, "update")

    def _timed(self, fn, phase: str):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[phase] += time.perf_counter() - started

        return timed


def _serve_until(learner, feeder, updates: int, timeout_s: float) -> None:
    """Run the learner's loop until it has made ``updates`` gradient steps in all."""
    deadline = time.monotonic() + timeout_s
    check = [0.0]

    def should_stop() -> bool:
        if learner.counters.updates >= updates:
            return True
        now = time.monotonic()
        if now < check[0]:
            return False
        check[0] = now + 0.5
        return now > deadline or not feeder.is_alive()

    learner.serve(should_stop)
    if learner.counters.updates < updates:
        raise RuntimeError(f"the learner made {learner.counters.updates} of {updates} updates "
                           f"({'the feeder died' if not feeder.is_alive() else f'in {timeout_s:g} s'})")


def _measure(learner, feeder, blocks: int, calls: int) -> dict:
    import jax

    phases = _Phases(learner)
    training, counters = learner.training, learner.counters
    k = training.updates_per_call
    learner.publish()
    _serve_until(learner, feeder, 4 * k, timeout_s=600)  # the first batches, the update's compile
    resident = jax.device_put(learner.data.batch()[0])
    jax.block_until_ready(phases.bare_update(resident))
    spent = dict.fromkeys(PHASES, 0.0)
    wall, loop_updates, bare_s = 0.0, 0, 0.0
    cpu = {"bare": 0.0, "loop": 0.0}  # this process's CPU seconds: what a loaded machine's noise barely moves
    start_rows = counters.rows
    for block in range(blocks):
        for kind in ("bare", "loop") if block % 2 == 0 else ("loop", "bare"):
            cpu_started = time.process_time()
            if kind == "bare":
                started = time.perf_counter()
                for _ in range(calls):
                    phases.bare_update(resident)
                jax.block_until_ready(training.state)
                elapsed = time.perf_counter() - started
                bare_s += elapsed
                cpu["bare"] += time.process_time() - cpu_started
                continue
            before, updates = dict(phases.spent), counters.updates
            started = time.perf_counter()
            _serve_until(learner, feeder, updates + calls * k, timeout_s=600)
            served = time.perf_counter()
            jax.block_until_ready(training.state)
            ended = time.perf_counter()
            phases.spent["update"] += ended - served
            cpu["loop"] += time.process_time() - cpu_started
            wall += ended - started
            loop_updates += counters.updates - updates
            for phase in PHASES:
                spent[phase] += phases.spent[phase] - before[phase]
    # totals over many short alternating blocks: a busy machine's load changes over seconds hit
    # both alike, and the loop's periodic work (publishing, metrics) is charged in full
    loop_rate, bare_rate = loop_updates / wall, blocks * calls * k / bare_s
    ratio = loop_rate / bare_rate
    shares = {f"learner_loop_share_{p}": round(spent[p] / wall, 4) for p in PHASES}
    shares["learner_loop_share_other"] = round(1 - sum(spent.values()) / wall, 4)
    rows = counters.rows - start_rows
    return {"learner_loop_updates_per_s": round(loop_rate, 1), "bare_update_updates_per_s": round(bare_rate, 1),
            "learner_loop_ratio": round(ratio, 3),
            # the same ratio in this process's CPU seconds per update: the loop does the bare update's
            # work and more, so above 1 the bench missed work; unlike the wall-clock ratio, the other
            # processes of a busy machine hardly move it
            "learner_loop_cpu_ratio": round((cpu["bare"] / (blocks * calls * k)) / (cpu["loop"] / loop_updates), 3),
            "learner_loop_bench_bug": bool(ratio > 1),  # the loop cannot beat the update it runs
            "learner_loop_goal_met": bool(ratio >= 0.95),
            **shares,
            "learner_loop_update_vs_bare": round(spent["update"] / loop_updates * bare_rate, 3),
            "learner_loop_updates_per_row": round(loop_updates / rows, 3) if rows else None,
            "learner_loop_seconds": round(wall, 2), "learner_loop_blocks": blocks}


def run(quick: bool = False) -> dict:
    from ..algos import registry
    from ..config import default_config
    from ..learner import make_learner
    from ..robot import layout_of

    blocks, calls = (8, 5) if quick else (16, 15)  # 80 or 240 updates a block, alternating
    # DDPG at its defaults, whatever the pendulum's own default algorithm; no budget: blocks end the loop
    config = dataclasses.replace(default_config("pendulum"), algorithm=registry.DEFAULT, steps=10**12)
    (kind,) = layout_of(config).kinds
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    with tempfile.TemporaryDirectory() as tmp:
        learner = make_learner(config, Path(tmp) / "run")
        learner.server.know_incarnations((FEED_INCARNATION,))  # the feeder's rows: an earlier learner of the run
        feeder = ctx.Process(target=_feed, args=(learner.endpoint, kind.name, kind.observation_spec.to_msg(),
                                                 kind.action_spec.to_msg(), stop), daemon=True)
        feeder.start()
        try:
            result = _measure(learner, feeder, blocks, calls)
        finally:
            stop.set()
            error = learner.shutdown("benchmark done")
            feeder.join(30)
            if feeder.is_alive():
                feeder.kill()
        if error is not None:
            raise error
    lc, algo = config.learner, config.ddpg
    return {**result, **devices.run(quick), "updates_per_step": lc.updates_per_step, "updates_per_call": lc.updates_per_call,
            "publish_every": lc.publish_every, "batch_size": algo.batch_size,
            "hidden_sizes": list(algo.hidden_sizes), "rows_per_batch_sent": ROWS_PER_BATCH,
            "algorithm": config.algorithm, "task": config.task}
