"""The on-policy data side: PPO's rollout segments, synchronous or asynchronous.

Rows are cut into per-stream segments of T transitions
(:class:`~embodyrl.algos.ppo.rollouts.RolloutAssembler`); when B segments are
ready, they are one training call's ``[T, B]`` batch. There is no replay: a
batch is trained on once and dropped, and rows are acknowledged at once (a
crash loses only the iteration in progress, which the next weights could
not use anyway). Every iteration publishes, so staleness is counted in
iterations.

``ppo.max_staleness = 0`` is synchronous PPO as in the textbook: each stream
is granted exactly the rows that complete the iteration's B segments (plus
room for one final row), so actors that act only within credit
(``actor.act_within_credit``) stop once the iteration's data is acted, wait
while the learner trains, and act on with the new weights, which reach them
before the next credit. Nothing is acted by replaced weights; the one
transition per stream whose successor closes the last segment of an
iteration is discarded (it cannot complete before the learner publishes).
``k > 0`` accepts data up to k iterations old (the update corrects it with
V-trace and shrinks its step when the effective sample size collapses);
credits keep the actors within (1 + k) iterations.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..algos.ppo.config import PPOConfig
from ..algos.ppo.rollouts import RolloutAssembler
from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import PolicyVersion, StepRecorder, Steps
from ..transport.credits import grant_in_turn


class RolloutData:
    on_policy = True
    """Actors act on the newest weights (synchronous: they wait for them), so each publication goes
    out as its call ends rather than while the next call runs (:class:`~.service.DuePublication`)."""

    def __init__(self, config: PPOConfig, credit_quantum: int, version: PolicyVersion,
                 observation_spec: DictSpec, action_spec: ArraySpec):
        self.config, self.credit_quantum = config, credit_quantum
        self.observation_spec, self.action_spec = observation_spec, action_spec
        self.assembler = RolloutAssembler(config.rollout_length, config.max_staleness, version)
        self._taken: dict[int, int] = {}  # actor id -> newest seq taken: used once, so "durable" at once
        self._staleness: np.ndarray | None = None

    def add(self, steps: Steps, seq: int, actor_id: int) -> int:
        self._taken[actor_id] = seq
        before = self.assembler.stats.discarded
        self.assembler.add(steps)
        return self.assembler.stats.discarded - before

    def commit(self, final: bool = False) -> bool:
        return True  # nothing to make durable: acknowledged as taken

    def durable(self) -> Mapping[int, int]:
        return self._taken

    def grant_credits(self, server) -> None:
        if self.config.max_staleness == 0:
            self._grant_synchronous(server)
        else:
            self._grant_asynchronous(server)

    def _grant_synchronous(self, server) -> None:
        """Grant each stream the rows that complete this iteration's segments, and no more.

        Streams already holding credit for a segment come first (a grant cannot be taken back),
        then those closest to a full segment; once the ready segments and those in progress make
        B, the rest get nothing until the learner has trained and published. Each actor also
        holds room to act (a one-device actor acting within credit stops one row short of its
        credit, kept for an episode's final row; an actor of L devices needs 2L - 1), so a
        segment never waits on credit the actor cannot use. With several devices per actor
        they step together, so one may act past its segment (discarded).
        """
        book, sessions = server.credits, server.sessions
        streams = sorted(((book.held(identity) <= 1, self.assembler.rows_to_complete(session.actor_id, d),
                           identity) for identity, session in sessions.items() for d in session.devices),
                         key=lambda item: item[:2])
        wanted: dict[bytes, int] = {}
        for _, rows, identity in streams[: max(0, self.config.rollouts_per_iteration - self.assembler.ready)]:
            room = 2 * len(sessions[identity].devices) - 1
            wanted[identity] = wanted.get(identity, room) + rows
        for identity, rows in wanted.items():
            held = book.held(identity)
            if rows > held:
                server.grant(sessions[identity], rows - held)

    def _grant_asynchronous(self, server) -> None:
        """Keep ready rows plus rows promised within (1 + max_staleness) iterations, plus a quantum
        per actor. Segments still being built do not count: each stream holds at most one, and
        counting them could leave every stream one batch short of a segment, waiting for credit."""
        T, B = self.config.rollout_length, self.config.rollouts_per_iteration
        target = T * B * (1 + self.config.max_staleness) + self.credit_quantum * len(server.sessions)
        grant_in_turn(server, self.credit_quantum,
                      lambda promised: promised + self.assembler.ready * T <= target)

    def trainable(self) -> bool:
        return self.assembler.ready >= self.config.rollouts_per_iteration

    def batch(self) -> tuple[dict, dict]:
        batch, counts = self.assembler.take(self.config.rollouts_per_iteration)
        staleness = self.assembler.version.count - counts
        return self._prepare(batch), {"staleness_mean": float(staleness.mean()),
                                      "staleness_max": int(staleness.max())}

    def _prepare(self, batch: dict) -> dict:
        """The assembler's batch as the update takes it: discounts from terminations, float flags."""
        batch["discount"] = (self.config.discount * (1.0 - batch.pop("terminated"))).astype(np.float32)
        batch["truncated"] = batch["truncated"].astype(np.float32)
        return batch

    def trained(self, updates: int) -> None:
        pass

    def owed(self) -> int:
        return 0  # an iteration trains on the rollouts of one version, none owed past the budget

    def published(self, version: PolicyVersion) -> int:
        return self.assembler.advance(version)

    def restored(self, counters) -> None:
        pass

    def example_batch(self) -> dict:
        """Zeros laid out as a real batch: the assembler's own output for B streams of T + 1 rows."""
        T, B = self.config.rollout_length, self.config.rollouts_per_iteration
        version = PolicyVersion(self.assembler.version.incarnation, 0)
        assembler = RolloutAssembler(T, 0, version)
        observation, action = self.observation_spec.zeros(), self.action_spec.zeros()
        for stream in range(B):
            recorder = StepRecorder(self.observation_spec, self.action_spec, actor_id=stream, device_id=0,
                                    capacity=T + 1)
            for _ in range(T + 1):
                recorder.add(observation, action, action, 0.0, False, False, version)
            assembler.add(recorder.flush())
        batch, _ = assembler.take(B)
        return self._prepare(batch)

    def metrics(self) -> dict:
        a = self.assembler
        return {"max_staleness": self.config.max_staleness,
                "discarded_fraction": round(a.stats.discarded / max(1, a.stats.transitions), 4),
                "ready_segments": a.ready, "buffered_rows": a.buffered_rows}

    def close(self, failed: bool) -> None:
        pass
