"""The rollout assembler: step streams into time-major PPO segments, stale data discarded by version."""

import numpy as np
import pytest

from embodyrl.algos.ppo.rollouts import RolloutAssembler
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import NO_POLICY, PolicyVersion, StepRecorder

OBS = DictSpec.of(ArraySpec("x", (2,), np.float32))
ACT = ArraySpec("action", (1,), np.float32, -1.0, 1.0)
INC = 12345


def _stream(rows, actor_id=0, episode_length=None, version_of=lambda t: PolicyVersion(INC, 1)):
    """Steps of one actor: observation x = (t, t), proposed action t/1000 (outside the bounds when large),
    reward t; every ``episode_length`` steps the episode is truncated and closed by a final row."""
    rec = StepRecorder(OBS, ACT, actor_id=actor_id, device_id=0, capacity=rows * 2 + 2)
    for t in range(rows):
        obs = {"x": np.full(2, t, np.float32)}
        end = episode_length is not None and (t + 1) % episode_length == 0
        rec.add(obs, np.zeros(1, np.float32), np.array([t / 1000], np.float32), float(t), False, end,
                version_of(t), log_prob=-float(t))
        if end:
            rec.add_final({"x": np.full(2, -t, np.float32)})
    return rec.flush()


def test_segments_are_time_major_with_next_observations_and_behaviour_log_probs():
    asm = RolloutAssembler(rollout_length=4, max_staleness=0, version=PolicyVersion(INC, 1))
    asm.add(_stream(9, episode_length=3))
    assert asm.ready == 2  # 9 transitions: two segments of 4, the ninth waits
    batch, counts = asm.take(2)
    assert batch["observation"]["x"].shape == (4, 2, 2) and batch["reward"].shape == (4, 2)
    np.testing.assert_array_equal(batch["reward"][:, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(batch["behaviour_log_prob"][:, 1], [-4, -5, -6, -7])
    np.testing.assert_array_equal(batch["action"][:, 0, 0], np.float32([0, 1, 2, 3]) / 1000)
    # step 2 was truncated: its next observation is the episode's own final row, not the next episode's start
    np.testing.assert_array_equal(batch["truncated"][:, 0], [False, False, True, False])
    np.testing.assert_array_equal(batch["next_observation"]["x"][:, 0, 0], [1, 2, -2, 4])
    np.testing.assert_array_equal(batch["bootstrap_observation"]["x"][:, 0], [4, 8])  # o after each segment
    assert (counts == 1).all() and asm.take(1) is None


def test_synchronous_mode_discards_everything_acted_by_older_weights():
    asm = RolloutAssembler(rollout_length=4, max_staleness=0, version=PolicyVersion(INC, 1))
    asm.add(_stream(6))
    assert asm.ready == 1 and asm.buffered_rows == 4 + 2
    dropped = asm.advance(PolicyVersion(INC, 2))  # the learner published
    assert dropped == 4 + 1 and asm.ready == 0  # the ready segment and the transition in progress
    asm.add(_stream(6, actor_id=1))  # another actor still acting with version 1
    assert asm.ready == 0 and asm.stats.discarded == 5 + 5
    asm.add(_stream(6, actor_id=2, version_of=lambda t: PolicyVersion(INC, 2)))
    assert asm.ready == 1


def test_asynchronous_mode_keeps_data_up_to_k_iterations_old():
    asm = RolloutAssembler(rollout_length=4, max_staleness=2, version=PolicyVersion(INC, 3))
    asm.add(_stream(5, version_of=lambda t: PolicyVersion(INC, 1)))  # 2 iterations old: kept
    asm.add(_stream(5, actor_id=1, version_of=lambda t: PolicyVersion(INC, 0)))  # 3 old: dropped
    assert asm.ready == 1
    asm.advance(PolicyVersion(INC, 4))  # now 3 old
    assert asm.ready == 0


def test_a_segment_restarts_where_versions_turn_fresh_and_other_incarnations_are_dropped():
    asm = RolloutAssembler(rollout_length=3, max_staleness=0, version=PolicyVersion(INC, 2))
    asm.add(_stream(8, version_of=lambda t: PolicyVersion(INC, 1 if t < 3 else 2)))
    batch, _ = asm.take(1)
    np.testing.assert_array_equal(batch["reward"][:, 0], [3, 4, 5])  # nothing of version 1 inside
    asm.add(_stream(5, actor_id=1, version_of=lambda t: PolicyVersion(INC + 1, 2)))  # another learner's
    asm.add(_stream(5, actor_id=2, version_of=lambda t: NO_POLICY))  # before any weights
    assert asm.ready == 0


def test_an_interrupted_episode_breaks_the_segment():
    asm = RolloutAssembler(rollout_length=4, max_staleness=0, version=PolicyVersion(INC, 1))
    first = _stream(3)
    asm.add(first)
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0, capacity=8)  # a new episode id, no final row
    for t in range(5):
        rec.add({"x": np.full(2, 10 + t, np.float32)}, np.zeros(1, np.float32), np.zeros(1, np.float32),
                float(10 + t), False, False, PolicyVersion(INC, 1))
    asm.add(rec.flush())
    batch, _ = asm.take(1)
    np.testing.assert_array_equal(batch["reward"][:, 0], [10, 11, 12, 13])


@pytest.mark.parametrize("k", [0, 3])
def test_take_returns_oldest_segments_first(k):
    asm = RolloutAssembler(rollout_length=2, max_staleness=k, version=PolicyVersion(INC, 1))
    asm.add(_stream(7))
    first, _ = asm.take(1)
    second, _ = asm.take(1)
    assert first["reward"][0, 0] < second["reward"][0, 0]
