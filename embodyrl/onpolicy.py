"""The on-policy learner service: PPO, synchronous or asynchronous, from the actors' step stream.

One loop, as the off-policy :class:`~embodyrl.learner.Learner`, on the same
transport (:class:`~embodyrl.transport.LearnerServer`: handshakes, acks,
credits, versioned weights)::

    poll the socket -> validated step batches -> RolloutAssembler (per-stream segments of T)
    ACK each batch at once: on-policy data is used once and need not survive a crash
    grant credits while the rows held and promised stay within (1 + max_staleness) iterations
    when B segments are ready: one jitted PPO iteration on the [T, B] batch, then publish

There is no replay: a batch is trained on once and dropped. The training
state and counters are checkpointed (Orbax, every
``learner.checkpoint_every_s`` and at the end), so ``--resume`` continues a
run; a crash loses the data of the iteration in progress (on-policy data is
worthless to the next weights anyway) and the training since the last
checkpoint.
Every iteration publishes, so staleness is counted in iterations.
``ppo.max_staleness = 0`` is synchronous PPO as in the textbook: the
learner grants each stream exactly the rows that complete the iteration's B
segments (plus room for one final row), so actors that act only within
credit (``actor.act_within_credit``, set for PPO) stop once the iteration's
data is acted, wait while the learner trains, and act on with the new
weights, which reach them before the next credit. Nothing is acted by
replaced weights; the one transition per stream whose successor closes the
last segment of an iteration is discarded (it cannot complete before the
learner publishes). ``k > 0`` accepts data up to k iterations old; the
update corrects it with V-trace from the behaviour log-probabilities,
measures the effective sample size and shrinks the step when it collapses;
credits keep the actors within (1 + k) iterations.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from .algos import ppo
from .algos.ppo.rollouts import RolloutAssembler
from .algos.registry import OnPolicy
from .checkpoint import Checkpointer
from .config import TrainConfig
from .episodes import EpisodeReturns
from .hal import params as flat_params
from .hal.specs import ArraySpec, DictSpec
from .hal.steps import PolicyVersion, StepRecorder, new_incarnation
from .hal.wire.protocol import DeviceInfo
from .hal.wire.security import ServerKeys
from .policy import save_policy
from .transport import LearnerServer, ReceivedSteps
from .transport.credits import GrantOrder


@dataclass
class Counters:
    env_steps: int = 0
    rows: int = 0
    episodes: int = 0
    updates: int = 0
    """PPO iterations."""
    publications: int = 0
    discarded: int = 0
    """Transitions dropped as too stale (or taken before any weights)."""
    rows_behind: int = 0
    """Rows received that were acted by weights older than the learner's current ones."""


class OnPolicyLearner:
    def __init__(self, config: TrainConfig, observation_spec: DictSpec, action_spec: ArraySpec,
                 run_dir: Path, *, keys: ServerKeys | None = None, allow_insecure: bool = False):
        """``keys``: CurveZMQ for the actors' link; without them only loopback unless ``allow_insecure``."""
        self.config = config
        self.ppo = config.ppo
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.incarnation = new_incarnation()
        self.algorithm = OnPolicy("ppo", config.ppo)
        self.networks, self.state = ppo.init(jax.random.key(config.seed), observation_spec, action_spec, config.ppo)
        self._update = jax.jit(ppo.make_update(self.networks, config.ppo), donate_argnums=0)
        self.compile_s = self._compile()
        self.server = LearnerServer(config.learner.bind, run_id=self.run_dir.name, incarnation=self.incarnation,
                                    admit=self._admit, peer_timeout_s=config.learner.peer_timeout_s,
                                    keys=keys, allow_insecure=allow_insecure)
        self.counters = Counters()
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints")
        self.resumed = self.checkpointer.latest_step() is not None
        if self.resumed:
            self._restore()
        self.assembler = RolloutAssembler(config.ppo.rollout_length, config.ppo.max_staleness, self.version)
        self._credit: dict[bytes, int] = {}
        self._grant_order = GrantOrder()
        self._received: dict[int, int] = {}
        self._returns = EpisodeReturns()
        self._metrics: dict[str, float] = {}
        self._iteration_s: list[float] = []

    def _restore(self) -> None:
        """Continue from the newest checkpoint: the training state and the counters (the
        publication count goes on, under this start's new incarnation)."""
        self.state, record = self.checkpointer.restore(self.state)
        if record.get("algorithm") != "ppo":
            raise ValueError(f"{self.checkpointer.directory}: a checkpoint of {record.get('algorithm')!r}, not ppo")
        self.counters = Counters(**record["counters"])

    def checkpoint(self) -> None:
        """Save the training state and counters, once per iteration count."""
        if self.checkpointer.latest_step() == self.counters.updates:
            return
        self.checkpointer.save(self.counters.updates, self.state, {
            "counters": dataclasses.asdict(self.counters), "incarnation": self.incarnation, "algorithm": "ppo"})

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def version(self) -> PolicyVersion:
        return PolicyVersion(self.incarnation, self.counters.publications)

    def _admit(self, devices: list[DeviceInfo]) -> str | None:
        for d in devices:
            if d.observation_spec != self.observation_spec or d.action_spec != self.action_spec:
                return f"device {d.name!r} has specs that differ from this learner's task"
        return None

    # -- the loop --------------------------------------------------------
    def run(self, should_stop=lambda: False) -> Counters:
        lc = self.config.learner
        self.publish()
        metrics_file = (self.run_dir / "metrics.jsonl").open("a")
        start = last_log = last_beat = last_checkpoint = time.monotonic()
        last_updates = 0
        try:
            while self.counters.env_steps < self.config.steps and not should_stop():
                trainable = self.assembler.ready >= self.ppo.rollouts_per_iteration
                for batch in self.server.poll(timeout_ms=0 if trainable else 10):
                    self._ingest(batch)
                self._grant_credits()
                if self.assembler.ready >= self.ppo.rollouts_per_iteration:
                    self._train()
                now = time.monotonic()
                if now - last_beat >= 1.0:
                    self.server.heartbeat()
                    last_beat = now
                if now - last_checkpoint >= lc.checkpoint_every_s:
                    self.checkpoint()
                    last_checkpoint = now
                if now - last_log >= lc.log_every_s:
                    rate = (self.counters.updates - last_updates) / (now - last_log)
                    self._log(metrics_file, now - start, rate)
                    last_log, last_updates = now, self.counters.updates
        finally:
            self._log(metrics_file, time.monotonic() - start, 0.0)
            metrics_file.close()
            self.server.bye("training complete")
            self.save()
            self.checkpoint()
            self.checkpointer.close()
            self.server.close()
        return self.counters

    def _ingest(self, batch: ReceivedSteps) -> None:
        steps, session = batch.steps, batch.session
        self.server.ack(session, batch.seq)  # used once, never stored: nothing to make durable first
        if batch.seq <= self._received.get(session.actor_id, 0):  # a resend of a batch already taken
            return
        self._received[session.actor_id] = batch.seq
        c = self.counters
        c.rows += len(steps)
        c.env_steps += steps.env_steps
        acted = ~steps.final.astype(bool)  # a final row holds only an observation: no policy acted it
        c.rows_behind += int(np.sum(acted & ((steps.policy_count < self.counters.publications)
                                             | (steps.policy_incarnation != self.incarnation))))
        self._credit[session.identity] = self._credit.get(session.identity, 0) - len(steps)
        before = self.assembler.stats.discarded
        self.assembler.add(steps)
        c.discarded += self.assembler.stats.discarded - before
        self.counters.episodes += self._returns.add(steps)

    def _grant_credits(self) -> None:
        if self.ppo.max_staleness == 0:
            self._grant_synchronous_credits()
        else:
            self._grant_asynchronous_credits()

    def _grant_synchronous_credits(self) -> None:
        """Grant each stream the rows that complete this iteration's segments, and no more.

        Streams already holding credit for a segment come first (a grant cannot be taken back),
        then those closest to a full segment; once the ready segments and those in progress make
        B, the rest get nothing until the learner has trained and published. Each actor also
        holds room to act (a one-device actor acting within credit stops one row short of its
        credit, kept for an episode's final row; an actor of L devices needs 2L - 1), so a
        segment never waits on credit the actor cannot use. With several devices per actor
        they step together, so one may act past its segment (discarded); untested.
        """
        sessions = self.server.sessions
        self._forget_gone(sessions)
        ready = self.assembler.ready
        streams = sorted(((self._credit.get(identity, 0) <= 1, self.assembler.rows_to_complete(session.actor_id, d),
                           identity) for identity, session in sessions.items() for d in session.devices),
                         key=lambda item: item[:2])
        wanted: dict[bytes, int] = {}
        for _, rows, identity in streams[: max(0, self.ppo.rollouts_per_iteration - ready)]:
            # room to act: an actor steps all its L devices at once and keeps one final row each back
            room = 2 * len(sessions[identity].devices) - 1
            wanted[identity] = wanted.get(identity, room) + rows
        for identity, rows in wanted.items():
            held = self._credit.get(identity, 0)
            if rows > held:
                self._credit[identity] = rows
                self.server.grant(sessions[identity], rows - held)

    def _forget_gone(self, sessions) -> None:
        for identity in list(self._credit):
            if identity not in sessions:
                del self._credit[identity]
                self._grant_order.forget(identity)

    def _grant_asynchronous_credits(self) -> None:
        """Keep ready rows plus rows promised within (1 + max_staleness) iterations, plus a quantum
        per actor. Segments still being built do not count: each stream holds at most one, and
        counting them could leave every stream one batch short of a segment, waiting for credit."""
        quantum = self.config.learner.credit_quantum
        sessions = self.server.sessions
        self._forget_gone(sessions)
        per_iteration = self.ppo.rollout_length * self.ppo.rollouts_per_iteration
        target = per_iteration * (1 + self.ppo.max_staleness) + quantum * len(sessions)
        for identity, session in self._grant_order.order(sessions, self._credit):
            outstanding = sum(max(v, 0) for v in self._credit.values())
            if outstanding + self.assembler.ready * self.ppo.rollout_length + quantum > target:
                return
            if self._credit.get(identity, 0) < quantum:
                self._credit[identity] = self._credit.get(identity, 0) + quantum
                self.server.grant(session, quantum)
                self._grant_order.granted(identity)

    def _compile(self) -> float:
        """Compile the iteration before any actor connects, on zeros laid out as a real batch (the
        assembler's own output), so the first iteration does not hold the actors up; seconds taken."""
        started = time.monotonic()
        T, B = self.ppo.rollout_length, self.ppo.rollouts_per_iteration
        version = PolicyVersion(self.incarnation, 0)
        assembler = RolloutAssembler(T, 0, version)
        observation, action = self.observation_spec.zeros(), self.action_spec.zeros()
        for stream in range(B):
            recorder = StepRecorder(self.observation_spec, self.action_spec, actor_id=stream, device_id=0,
                                    capacity=T + 1)
            for _ in range(T + 1):
                recorder.add(observation, action, action, 0.0, False, False, version)
            assembler.add(recorder.flush())
        batch, _ = assembler.take(B)
        _, scratch = ppo.init(jax.random.key(self.config.seed), self.observation_spec, self.action_spec, self.ppo)
        jax.block_until_ready(self._update(scratch, self._prepare(batch)))  # scratch is donated, then dropped
        return time.monotonic() - started

    def _prepare(self, batch: dict) -> dict:
        """The assembler's batch as the update takes it: discounts from terminations, float flags."""
        batch["discount"] = (self.ppo.discount * (1.0 - batch.pop("terminated"))).astype(np.float32)
        batch["truncated"] = batch["truncated"].astype(np.float32)
        return batch

    def _train(self) -> None:
        started = time.monotonic()
        batch, counts = self.assembler.take(self.ppo.rollouts_per_iteration)
        batch = self._prepare(batch)
        staleness = self.counters.publications - counts
        self.state, metrics = self._update(self.state, batch)
        self.counters.updates += 1
        self.publish()
        self._metrics = {k: float(v) for k, v in metrics.items()}
        self._metrics.update(staleness_mean=float(staleness.mean()), staleness_max=int(staleness.max()))
        self._iteration_s.append(time.monotonic() - started)

    # -- weights ---------------------------------------------------------
    def actor_weights(self) -> dict[str, np.ndarray]:
        actor = jax.device_get(ppo.actor_params(self.state.params))
        return flat_params.flatten({"actor": actor})

    def publish(self) -> None:
        """Send the new weights; from now on, data of older ones ages by one iteration."""
        self.counters.publications += 1
        self.counters.discarded += self.assembler.advance(self.version)
        self.server.publish(self.version, self.actor_weights())

    def save(self) -> None:
        save_policy(self.run_dir / "policy", self.version, self.actor_weights(),
                    self.observation_spec, self.action_spec, self.algorithm)

    def _log(self, file, elapsed: float, updates_per_s: float) -> None:
        c = self.counters
        returns = self._returns.take_finished()
        iteration_s, self._iteration_s = self._iteration_s, []
        record = {
            "time": round(elapsed, 3), "env_steps": c.env_steps, "episodes": c.episodes,
            "episode_return": float(np.mean(returns)) if returns else None,
            "updates": c.updates, "updates_per_s": round(updates_per_s, 2),
            "policy_version": c.publications, "actors": len(self.server.sessions),
            "max_staleness": self.ppo.max_staleness, "discarded": c.discarded, "rows_behind": c.rows_behind,
            "discarded_fraction": round(c.discarded / max(1, self.assembler.stats.transitions), 4),
            "ready_segments": self.assembler.ready, "buffered_rows": self.assembler.buffered_rows,
            "iteration_s": float(np.mean(iteration_s)) if iteration_s else None, "compile_s": round(self.compile_s, 2),
            "rejected": sum(self.server.stats.rejected.values()),
            "messages_in": self.server.stats.messages_in, "duplicates_dropped": self.server.stats.duplicates,
            **self._metrics,
        }
        file.write(json.dumps(record) + "\n")
        file.flush()
