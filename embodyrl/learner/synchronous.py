"""One process, one environment step then its updates: the synchronous loop (CleanRL's).

``embodyrl train --synchronous``. The same actor loop (:class:`~embodyrl.hal.actor.ActorLoop`),
the same replay (:class:`~.replay_side.ReplayData`) and the same jitted update
(:class:`~.service.Training`) as the learner and actor processes, with the wire replaced by a
call (:class:`InlineLearner`, a :class:`~embodyrl.hal.link.Link`)::

    actor acts, steps, records one row  ->  send_steps: the row into the replay
                                        ->  the updates it buys (updates_per_step), each on a batch
                                            sampled now, the newest row in the replay
                                        ->  the new weights, which act the next step

So with one device a policy is never older than 0 updates (with several, each acts with the
weights of the step before the previous device's updates: ``updates_per_step`` old), and the
learner is never ahead of or behind the update-to-data ratio. Both are measured as the learner
service measures them (:class:`~.service.PolicyAge`). It is the reference the asynchronous path is measured against
(``docs/benchmarks.md``), and a way to tell a learning problem from a path problem. It drives
simulated devices with an off-policy algorithm; it has no network, console or person, and does
not resume.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from ..algos.heads import over
from ..hal.steps import PolicyVersion, Steps, new_incarnation
from .build import off_policy_parts, placement_of
from .episodes import EpisodeReturns
from .hosts import OneHost
from .metrics import MetricsLog
from .service import PolicyAge, SkippedSteps, returns_by_kind, train_call
from .snapshots import Snapshots


def synchronous_config(config):
    """``config`` as the synchronous loop runs it: one update per training call, no prefetch, each
    row sent as it is recorded; the replay's rate limiter set loose enough never to hold back the
    updates :class:`InlineLearner` counts itself (no credit is granted here)."""
    lc = config.learner
    quantum = 1 + 2  # TrainConfig's least for a batch of one row (send_every + 2)
    loose = max(2 * quantum, math.ceil(2 / lc.updates_per_step))
    return dataclasses.replace(
        config, synchronous=True,
        learner=dataclasses.replace(lc, updates_per_call=1, prefetch_batches=0, rate_tolerance=loose,
                                    credit_quantum=quantum),
        actor=dataclasses.replace(config.actor, send_every=1))


def refusal(config) -> str | None:
    """Why ``config`` cannot run synchronously (None: it can)."""
    from ..cli.person import needs_real_pace

    if config.algo.on_policy:
        return f"{config.algorithm} learns on-policy; the synchronous loop drives replay-based algorithms"
    if config.actors != 1:
        return "the synchronous loop drives one actor (actors: 1)"
    if config.console or needs_real_pace(config) or config.learner.hosts > 1:
        return "the synchronous loop drives a simulator: no console, person, real-time pace or several hosts"
    return None


class InlineLearner:
    """The learner's half of the synchronous loop, called by the actor loop as its link."""

    connected = True
    credits = 1 << 40

    def __init__(self, data, training, *, budget: int, metrics_sink=None, snapshots: Snapshots | None = None,
                 save_policy: Callable | None = None, log_every_s: float = 1.0, kinds=((), int),
                 on_record: Callable[[dict], None] | None = None):
        self.data, self.training, self.budget = data, training, budget
        self.metrics_sink, self.snapshots, self.save_policy = metrics_sink, snapshots, save_policy
        self.log_every_s, (self.kind_names, self.kind_of), self.on_record = log_every_s, kinds, on_record
        self.bye_reason: str | None = None
        self.version = PolicyVersion(new_incarnation(), 0)
        self.env_steps = self.rows = self.episodes = self.updates = self.skipped = 0
        self._seq, self._weights, self._metrics = 0, None, None
        self.policy_age = PolicyAge()
        self._skipped = SkippedSteps()
        self._returns = EpisodeReturns()
        self._started = self._logged = time.monotonic()
        self._updates_at_log = 0
        self.publish()

    # -- the Link the actor loop calls ----------------------------------------------
    def poll(self, timeout_ms: int = 0) -> None:
        if time.monotonic() - self._logged >= self.log_every_s:
            self.log()

    def send_steps(self, device_id: int, steps: Steps) -> int:
        self._seq += 1
        self.data.add(steps, self._seq, int(steps.actor_id[0]))
        self.data.commit()
        self.rows += len(steps)
        acted = ~steps.final & (steps.policy_incarnation == self.version.incarnation)
        if acted.any():  # the random warm-up's rows were acted by no weights
            self.policy_age.taken(steps.policy_count[acted], self.updates)
        self.env_steps += steps.env_steps
        self.episodes += self._returns.add(steps)
        trained = False
        while self.data.owed() >= self.training.updates_per_call and self.data.trainable():
            self._metrics, _ = train_call(self.data, self.training, self._skipped)
            self.updates += self.training.updates_per_call
            trained = True
        if trained:
            self.publish()
        if self.snapshots is not None:
            self.snapshots.observe(self.env_steps, self.updates, self.version, self.training.actor_weights)
        if self.env_steps >= self.budget:
            self.bye_reason = "training complete"
        return self._seq

    def take_weights(self):
        weights, self._weights = self._weights, None
        return weights

    def metrics(self) -> dict:
        return {"rows_sent": self.rows, "batches_sent": self._seq}

    # -- the learner's own -------------------------------------------------------------
    def publish(self) -> None:
        self.version = PolicyVersion(self.version.incarnation, self.version.count + 1)
        self.policy_age.published(self.version.count, self.updates)
        self._weights = (self.version, self.training.actor_weights())

    def log(self, final: bool = False) -> dict:
        """One metrics record: the learner service's progress, training and replay keys (this loop
        has no wire, so none of the server's)."""
        now = time.monotonic()
        since = now - self._logged
        self.skipped += self._skipped.fold()
        by_device = self._returns.take_finished_by_device()
        returns = [total for _, total in by_device]
        record = {"time": round(now - self._started, 3), "env_steps": self.env_steps, "episodes": self.episodes,
                  "episode_return": float(np.mean(returns)) if returns else None, "updates": self.updates,
                  "updates_per_s": round((self.updates - self._updates_at_log) / since, 2) if since > 0 else 0.0,
                  "policy_version": self.version.count, **self.policy_age.interval(),
                  "nonfinite_updates_skipped": self.skipped, **self.data.metrics()}
        if self._metrics is not None:
            record.update({name: float(np.mean(v)) for name, v in jax.device_get(self._metrics).items()})
        record.update(returns_by_kind(by_device, self.kind_names, self.kind_of))
        if final:
            record["policy_age_distribution"] = self.policy_age.distribution()
        self._logged, self._updates_at_log = now, self.updates
        if self.metrics_sink is not None:
            self.metrics_sink.write(record, step=self.env_steps)
        if self.on_record is not None:
            self.on_record(record)
        return record

    def close(self) -> None:
        """Save the policy, write the last record, make the replay durable and close it."""
        if self.save_policy is not None:
            self.save_policy(self.version, self.training.actor_weights())
        self.log(final=True)
        if self.metrics_sink is not None:
            self.metrics_sink.close()
        self.data.commit(final=True)
        self.data.close(failed=False)


def train_synchronous(config, run_dir: Path, on_record: Callable[[dict], None] | None = None,
                      should_stop: Callable[[], bool] = lambda: False) -> None:
    """Train ``config`` (as :func:`synchronous_config` made it) in this process into ``run_dir``:
    ``metrics.jsonl``, ``policy/``, ``snapshots/``, the replay. ``on_record``: each metrics record."""
    from ..cli.processes import actor_parts, actor_seed
    from ..hal.actor import ActorLoop
    from ..policy import save_policy
    from ..robot import layout_of

    config = synchronous_config(config)
    reason = refusal(config)
    if reason is not None:
        raise ValueError(f"--synchronous: {reason}")
    run_dir = Path(run_dir)
    layout = layout_of(config)
    algorithm = over(config.algo, layout)
    training, data = off_policy_parts(config, layout, algorithm, run_dir, placement=placement_of(config, OneHost()))

    def save(version, weights, directory: Path = run_dir / "policy") -> None:
        save_policy(directory, version, weights, layout.observation_spec, layout.action_spec, algorithm)

    learner = InlineLearner(data, training, budget=config.steps, metrics_sink=MetricsLog(run_dir),
                            snapshots=Snapshots.of(config, run_dir, save), save_policy=save,
                            log_every_s=config.learner.log_every_s, kinds=(layout.names, layout.kind_of),
                            on_record=on_record)
    seed = actor_seed(config.seed, 0)
    actor_config = dataclasses.replace(config.actor, actor_id=0, seed=seed)
    try:
        group, tasks, policies, _ = actor_parts(config, seed, "jax")
        with group:
            ActorLoop(group, tasks, policies, learner, actor_config).run(should_stop=should_stop)
    finally:
        learner.close()
