"""Synchronous PPO's actor side: act only within credit, wait (or pause in real time) for the next weights.

A real LearnerServer on loopback in a thread plays the synchronous learner:
it publishes weights, grants one iteration's rows, waits, then publishes new
weights and grants the next. The actor must act exactly the rows granted
(less the one kept for a final row), stop, and act the next ones with the
new weights only.
"""

import threading
import time

import numpy as np
import pytest

from actor_helpers import LinearPolicy
from embodyrl import envs
from embodyrl.algos.ppo.rollouts import RolloutAssembler
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.steps import PolicyVersion, StepRecorder
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.protocol import DeviceInfo
from embodyrl.transport import LearnerServer

INCARNATION = 7
GRANT = 20
HOLD_S = 0.6


class PhasedLearner(threading.Thread):
    """Two iterations: weights v1 + GRANT rows; hold HOLD_S once they are in; weights v2 + GRANT rows."""

    def __init__(self, server, loop_box):
        super().__init__(daemon=True)
        self.server, self.loop_box = server, loop_box
        self.batches, self.stop = [], threading.Event()
        self.acted_before_second_grant = None
        self.error = None

    def _poll_until(self, rows: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while sum(len(b.steps) for b in self.batches) < rows and not self.stop.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {sum(len(b.steps) for b in self.batches)} of {rows} rows arrived")
            self._poll(20)

    def _poll(self, timeout_ms: int) -> None:
        for b in self.server.poll(timeout_ms):
            self.batches.append(b)
            self.server.ack(b.session, b.seq)

    def run(self):
        try:
            deadline = time.monotonic() + 30
            while not self.server.sessions:
                if time.monotonic() > deadline:
                    raise TimeoutError("no actor connected")
                self._poll(20)
            session = next(iter(self.server.sessions.values()))
            self.server.publish(PolicyVersion(INCARNATION, 1), {"w": np.full((1, 3), 0.1, np.float32)})
            self.server.grant(session, GRANT)
            self._poll_until(GRANT - 1)
            held = time.monotonic() + HOLD_S  # the learner "trains": the actor must not act meanwhile
            while time.monotonic() < held:
                self._poll(20)
            self.acted_before_second_grant = self.loop_box[0].stats.env_steps
            self.server.publish(PolicyVersion(INCARNATION, 2), {"w": np.full((1, 3), -0.1, np.float32)})
            self.server.grant(session, GRANT)
            self._poll_until(2 * (GRANT - 1))
            while not self.stop.is_set():
                self._poll(20)
        except Exception as err:  # reported by the test
            self.error = err


@pytest.mark.parametrize("realtime", [False, True], ids=["simulator-waits", "realtime-pauses"])
def test_an_actor_acting_within_credit_stops_at_the_grant_and_acts_on_only_with_the_new_weights(realtime):
    server = LearnerServer(run_id="sync", incarnation=INCARNATION, peer_timeout_s=20)
    loop_box: list[ActorLoop] = []
    learner = PhasedLearner(server, loop_box)
    device, task = envs.make("pendulum")
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink(server.endpoint, actor_name="sync", actor_id=1, devices=[info],
                       handshake_timeout_s=20, peer_timeout_s=20)
    config = ActorConfig(actor_id=1, send_every=8, random_steps=0, act_within_credit=True,
                         realtime=realtime, time_scale=10.0, credit_timeout_s=30)
    learner.start()  # before the link connects: the handshake needs a server that polls
    try:
        with device, link:
            loop = ActorLoop(device, task, LinearPolicy(), link, config)
            loop_box.append(loop)
            stats = loop.run(max_steps=2 * (GRANT - 1))
            deadline = time.monotonic() + 20
            while link.unacked_rows and time.monotonic() < deadline:
                link.poll(20)
    finally:
        learner.stop.set()
        learner.join(10)
        server.close()
    assert learner.error is None, learner.error
    assert learner.acted_before_second_grant == GRANT - 1  # one row kept back for a final row, none beyond
    counts = np.concatenate([b.steps.policy_count for b in learner.batches])
    assert len(counts) == 2 * (GRANT - 1)
    assert (counts[: GRANT - 1] == 1).all() and (counts[GRANT - 1:] == 2).all()
    assert stats.credit_pauses >= 1 and stats.credit_wait_s >= HOLD_S * 0.8
    if realtime:  # the control loop kept its clock, counting the periods it held the device
        assert stats.credit_paused_steps >= 10  # ticked through the hold (200 Hz; a loaded machine misses some)
        assert stats.credit_paused_steps + stats.clock["missed"] >= HOLD_S * 200 * 0.8
        assert stats.clock["ticks"] >= stats.env_steps + stats.credit_paused_steps
    else:
        assert stats.credit_paused_steps == 0


def _stream_rows(recorder: StepRecorder, observations, version: PolicyVersion, final_after: int | None = None):
    for i, obs in enumerate(observations):
        truncated = final_after is not None and i == final_after
        recorder.add(obs, np.zeros(1, np.float32), np.zeros(1, np.float32), -1.0, False, truncated, version)
        if truncated:
            recorder.add_final(obs)
    return recorder.flush()


def test_rows_to_complete_counts_what_a_stream_still_owes_a_fresh_segment():
    device, _ = envs.make("pendulum")
    obs = [{"orientation": np.array([1.0, 0.0], np.float32), "angular_velocity": np.zeros(1, np.float32)}] * 10
    v1, v2 = PolicyVersion(INCARNATION, 1), PolicyVersion(INCARNATION, 2)
    assembler = RolloutAssembler(rollout_length=4, max_staleness=0, version=v1)
    assert assembler.rows_to_complete(3, 0) == 5  # T transitions need T + 1 rows
    recorder = StepRecorder(device.observation_spec, device.action_spec, actor_id=3, device_id=0, capacity=16)
    assembler.add(_stream_rows(recorder, obs[:3], v1))  # 2 complete transitions and a pending row
    assert assembler.rows_to_complete(3, 0) == 2
    assembler.add(_stream_rows(recorder, obs[:2], v1))  # the segment completes; its successor is pending
    assert assembler.ready == 1 and assembler.rows_to_complete(3, 0) == 4
    assembler.take(1)
    assembler.advance(v2)  # published: the pending row is stale and completes nothing fresh
    assert assembler.rows_to_complete(3, 0) == 5
    assembler.add(_stream_rows(recorder, obs[:2], v2, final_after=1))  # an episode ends: no pending row
    assert assembler.rows_to_complete(3, 0) == 3  # two fresh transitions, no pending row


def test_a_time_scale_that_is_not_positive_is_refused_by_name():
    with pytest.raises(ValueError, match="actor.time_scale"):
        ActorConfig(time_scale=0.0)
