"""Rewards: shaped sums, success detectors, a learned-classifier hook, and the arm task built on them."""

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.envs.arm import SUCCESS_DISTANCE_M
from embodyrl.hal.rewards import (
    LearnedReward,
    Reward,
    RewardTask,
    Shaped,
    Success,
    Term,
    distance,
    within_distance,
)


def obs(ee, target):
    return {"ee_pos": np.asarray(ee, np.float32), "target_pos": np.asarray(target, np.float32)}


def test_shaped_is_the_weighted_sum_of_its_terms():
    reach = distance("ee_pos", "target_pos")
    shaped = Shaped((Term("distance", -2.0, lambda o, a, n: reach(n)),
                     Term("effort", -0.5, lambda o, a, n: float(np.sum(a ** 2)))))
    assert isinstance(shaped, Reward)
    o, n = obs([0, 0, 0], [1, 0, 0]), obs([0, 0, 0], [0, 3, 4])
    a = np.array([1.0, 2.0])
    assert shaped(o, a, n) == pytest.approx(-2.0 * 5.0 - 0.5 * 5.0)
    assert shaped.terms_of(o, a, n) == pytest.approx({"distance": -10.0, "effort": -2.5})
    with pytest.raises(ValueError, match="distinct"):
        Shaped((Term("x", 1, lambda *_: 0), Term("x", 1, lambda *_: 0)))


def test_success_detector_pays_on_the_next_observation():
    success = Success(within_distance("ee_pos", "target_pos", 0.05), value=1.0)
    far, near = obs([0, 0, 0], [0.1, 0, 0]), obs([0, 0, 0], [0.03, 0, 0])
    assert success(far, None, near) == 1.0
    assert success(near, None, far) == 0.0
    with pytest.raises(ValueError, match="threshold"):
        within_distance("a", "b", 0.0)


def test_learned_reward_calls_the_classifier_and_refuses_nan():
    w = np.array([3.0, -1.0, 0.5], np.float32)

    def classifier(o):  # a logistic success classifier on the end-effector position
        return 1.0 / (1.0 + np.exp(-w @ o["ee_pos"]))

    n = obs([1.0, 0.0, 0.0], [0, 0, 0])
    score = float(1 / (1 + np.exp(-3.0)))
    assert LearnedReward(classifier)(None, None, n) == pytest.approx(score)
    assert LearnedReward(classifier, scale=2.0)(None, None, n) == pytest.approx(2 * score)
    assert LearnedReward(classifier, threshold=0.9)(None, None, n) == 1.0
    assert LearnedReward(classifier, threshold=0.99)(None, None, n) == 0.0
    with pytest.raises(ValueError, match="non-finite"):
        LearnedReward(lambda o: np.nan)(None, None, n)


def test_reward_task_terminates_on_its_detector():
    task = RewardTask(Success(within_distance("ee_pos", "target_pos", 0.05)), name="reach",
                      max_episode_steps=10, terminate_on=within_distance("ee_pos", "target_pos", 0.05))
    assert task.terminated(obs([0, 0, 0], [0.01, 0, 0]))
    assert not task.terminated(obs([0, 0, 0], [0.5, 0, 0]))
    assert task.max_episode_steps == 10 and task.name == "reach"


def test_the_arm_reward_is_exactly_the_documented_formula():
    device, task = envs.make("arm_reach")
    limits = device.action_spec.maximum
    rng = np.random.default_rng(0)
    with device:
        o = device.reset(seed=0)
        for _ in range(200):
            a = rng.uniform(-limits, limits).astype(np.float32)
            n = device.step(a)
            expected = (-float(np.linalg.norm(n["ee_pos"] - n["target_pos"]))
                        - 1e-4 * float(np.sum((np.asarray(a) / limits) ** 2)))
            assert task.reward(o, a, n) == expected  # exactly, not approximately
            o = n
    last = obs([0.4, 0, 0.5], [0.4, 0, 0.5 + SUCCESS_DISTANCE_M / 2])
    assert task.episode_metrics([last])["success"] == 1.0
