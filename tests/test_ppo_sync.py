"""Synchronous PPO's actor side: act only within credit, wait (or pause in real time) for the next weights.

The real learner service (:class:`~embodyrl.learner.testing.ServedLearner`) on loopback in a
thread, with PPO's own data side (:class:`~embodyrl.learner.rollout_side.RolloutData`,
``max_staleness=0``) and a tiny real PPO training, is the synchronous learner: it publishes
weights, grants one iteration's rows, trains once they are in, then publishes new weights and
grants the next. The actor must act exactly the rows granted (less the one kept for a final row),
stop, and act the next ones with the new weights only.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.algos.ppo.config import PPOConfig
from embodyrl.algos.ppo.rollouts import RolloutAssembler
from embodyrl.algos.registry import as_algorithm
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.steps import PolicyVersion, StepRecorder
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.protocol import DeviceInfo
from embodyrl.learner.rollout_side import RolloutData
from embodyrl.learner.service import Training
from embodyrl.learner.testing import ServedLearner
from embodyrl.policy import JaxPolicy

INCARNATION = 7
ROLLOUT = 18
"""T: one segment of one stream is an iteration (B = 1), well inside a pendulum episode (200 steps)."""
GRANT = ROLLOUT + 2
"""What the service grants a fresh stream: T + 1 rows complete T transitions, plus one row of room
for an episode's final row (``RolloutData._grant_synchronous``)."""
HOLD_S = 0.6
TINY = PPOConfig(hidden_sizes=(8,), rollout_length=ROLLOUT, rollouts_per_iteration=1, epochs=1, minibatches=1)


@pytest.mark.parametrize("realtime", [False, True], ids=["simulator-waits", "realtime-pauses"])
def test_an_actor_acting_within_credit_stops_at_the_grant_and_acts_on_only_with_the_new_weights(tmp_path, realtime):
    layout = envs.layout("pendulum")
    algorithm = as_algorithm(TINY)
    training = Training.of(algorithm, layout.observation_spec, layout.action_spec, 0,
                           updates_per_call=1, publish_every=1)  # one iteration, then publish: as a run builds it
    data = RolloutData(TINY, credit_quantum=32, version=PolicyVersion(INCARNATION, 0),  # (the quantum: async only)
                       observation_spec=layout.observation_spec, action_spec=layout.action_spec)
    device, task = envs.make("pendulum")
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    policy = JaxPolicy(TINY, layout)
    config = ActorConfig(actor_id=1, send_every=8, random_steps=0, act_within_credit=True,
                         realtime=realtime, time_scale=10.0, credit_timeout_s=30)
    # the learner closes first (its BYE ends an actor still waiting), then the actor's thread is joined
    with ThreadPoolExecutor(1) as pool, ServedLearner(tmp_path, layout, training=training, data=data,
                                                      run_id="sync", incarnation=INCARNATION,
                                                      peer_timeout_s=20) as learner:
        # The real update of a tiny PPO takes milliseconds: too short a wait to show an actor that
        # would act on past its grant. Training is held as the operator console holds it (ingest,
        # ACKs and credit go on), so the first iteration "trains" for HOLD_S once its rows are in.
        learner.pause_training()
        link = LearnerLink(learner.endpoint, actor_name="sync", actor_id=1, devices=[info],
                           handshake_timeout_s=20, peer_timeout_s=20)
        loop = ActorLoop(device, task, policy, link, config)

        def act():  # the actor, as in a run; its link lives in this thread only
            with device, link:
                stats = loop.run(max_steps=2 * (GRANT - 1))
                deadline = time.monotonic() + 20
                while link.unacked_rows and link.bye_reason is None and time.monotonic() < deadline:
                    link.poll(20)
            return stats

        actor = pool.submit(act)
        # the iteration's rows are in: one segment ready, the service grants nothing more until it publishes
        assert learner.wait(lambda service: service.data.trainable(), timeout_s=30), \
            (learner.rows, actor.done() and actor.exception())
        time.sleep(HOLD_S)  # the actor must not act meanwhile
        acted_before_second_grant = loop.stats.env_steps
        assert learner.rows == GRANT - 1 and not actor.done()  # it sent what it acted and waits
        # train, publish the new weights, grant the next iteration: the service tops the actor's credit
        # up to GRANT again (it still holds the row of room, so it is granted GRANT - 1 more rows)
        learner.pause_training(False)
        stats = actor.result(timeout=60)
        # the second iteration trains once the actor's last rows are in (then the service publishes again)
        assert learner.wait(lambda service: service.counters.updates == 2), \
            f"no second iteration: policy counts taken {[int(c) for t in learner.taken for c in t.steps.policy_count]}"
        rows_behind, discarded = learner.read(lambda service: (service.counters.rows_behind,
                                                               service.counters.discarded))
    assert acted_before_second_grant == GRANT - 1  # one row kept back for a final row, none beyond
    counts = np.concatenate([t.steps.policy_count for t in learner.taken])
    assert len(counts) == 2 * (GRANT - 1)
    assert (counts[: GRANT - 1] == 1).all() and (counts[GRANT - 1:] == 2).all()
    assert policy.version == PolicyVersion(INCARNATION, 2)  # the first iteration's weights, trained by PPO
    # nothing arrived acted by replaced weights; the one transition dropped is the first iteration's
    # last row, whose successor was acted by the new weights (it could not complete in time)
    assert rows_behind == 0 and discarded == 1
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
