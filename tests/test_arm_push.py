"""The arm push task: specs, seeded resets, the scripted expert and person, the camera (real MuJoCo)."""

import time

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.envs import arm_push
from embodyrl.envs.arm_push import ArmPushConfig, Person, expert

EPISODES = 20


@pytest.fixture(scope="module")
def pair():
    device, task = arm_push.make()
    with device:
        yield device, task


def _episode(device, task, policy, seed, person=None):
    """Run one episode; returns (observations, rewards, steps the person acted)."""
    observation = device.reset(seed=seed)
    observations, rewards, acted = [observation], [], 0
    for step in range(task.max_episode_steps):
        action = person(observation, step) if person is not None else None
        if action is None:
            action = policy(observation, step)
        else:
            acted += 1
        next_observation = device.step(action)
        rewards.append(task.reward(observation, action, next_observation))
        observations.append(next_observation)
        observation = next_observation
        if task.terminated(observation):
            break
    return observations, rewards, acted


def _random_policy(seed):
    rng = np.random.default_rng(seed)
    return lambda observation, step: rng.uniform(-1.0, 1.0, 2).astype(np.float32)


def test_specs_and_the_default_has_no_camera(pair):
    device, task = pair
    spec = device.action_spec
    assert spec.shape == (2,) and spec.dtype == np.float32
    np.testing.assert_array_equal(spec.minimum, [-1, -1])
    np.testing.assert_array_equal(spec.maximum, [1, 1])
    assert sorted(s.name for s in device.observation_spec.specs) == sorted(arm_push.FIELDS)
    assert all(s.shape == (3,) and s.dtype == np.float32 for s in device.observation_spec.specs)
    assert task.name == "arm_push" and task.max_episode_steps == 50 and task.success_reward == 1.0
    assert device.control_period_s == pytest.approx(0.04)  # 25 Hz
    observation = device.reset(seed=0)
    assert sorted(observation) == sorted(arm_push.FIELDS)
    np.testing.assert_allclose(observation["ee_pos"], [0.33, 0.0, arm_push.EE_HEIGHT_M], atol=1e-3)


def test_seeded_reset_is_deterministic_and_draws_within_the_ranges(pair):
    device, _ = pair
    config = ArmPushConfig()

    def rollout(seed):
        observations = [device.reset(seed=seed)]
        for action in ([1.0, 0.5], [0.0, -1.0], [-0.3, 0.2]):
            observations.append(device.step(np.array(action, np.float32)))
        return observations

    first, again = rollout(7), rollout(7)
    for a, b in zip(first, again, strict=True):
        for field in arm_push.FIELDS:
            np.testing.assert_array_equal(a[field], b[field])
    assert not np.array_equal(rollout(8)[0]["block_pos"], first[0]["block_pos"])
    for seed in range(30):
        o = device.reset(seed=seed)
        block, target = o["block_pos"][:2], o["target_pos"][:2]
        assert np.all(block >= np.array(config.block_low) - 1e-6) and np.all(block <= np.array(config.block_high) + 1e-6)
        assert np.all(target >= np.array(config.target_low) - 1e-6)
        assert np.all(target <= np.array(config.target_high) + 1e-6)
        low, high = config.target_distance_m
        assert low - 1e-6 <= arm_push.xy_distance(o) <= high + 1e-6
        assert not arm_push.block_at_target(o)


def test_the_arm_tracks_planar_commands_at_its_height_within_the_workspace(pair):
    device, _ = pair
    o = device.reset(seed=0)
    joints = device.data.qpos[:7].copy()
    moved = device.step(np.array([0.0, 1.0], np.float32))
    step = moved["ee_pos"] - o["ee_pos"]
    assert 0.015 < step[1] < 0.021 and abs(step[0]) < 1e-3  # ~90% of the 2 cm command
    assert np.abs(device.data.qpos[:7] - joints).max() > 0.01  # the joints moved it
    for _ in range(40):  # pinned against the far corner of the workspace
        moved = device.step(np.array([1.0, 1.0], np.float32))
        assert abs(moved["ee_pos"][2] - arm_push.EE_HEIGHT_M) < 0.003
    x, y = moved["ee_pos"][:2]
    assert x <= arm_push.WORKSPACE_HIGH[0] + 0.003 and y <= arm_push.WORKSPACE_HIGH[1] + 0.003
    assert np.hypot(x, y) <= arm_push.REACH_M + 0.003
    held = device.step(np.zeros(2, np.float32))
    np.testing.assert_allclose(held["ee_pos"], moved["ee_pos"], atol=2e-3)


def test_the_expert_pushes_the_block_to_the_target(pair):
    device, task = pair
    start = time.perf_counter()
    results = [_episode(device, task, expert, seed) for seed in range(EPISODES)]
    elapsed = time.perf_counter() - start
    successes = [task.episode_metrics(observations)["success"] for observations, _, _ in results]
    lengths = [len(rewards) for _, rewards, _ in results]
    assert np.mean(successes) >= 0.9, successes
    assert np.mean(lengths) < 0.7 * task.max_episode_steps, lengths
    assert elapsed < 10.0, f"{EPISODES} expert episodes took {elapsed:.1f} s"


def test_success_pays_one_and_ends_the_episode(pair):
    device, task = pair
    observations, rewards, _ = _episode(device, task, expert, seed=3)
    assert rewards[-1] == 1.0 and all(r == 0.0 for r in rewards[:-1])
    assert task.terminated(observations[-1]) and not any(task.terminated(o) for o in observations[:-1])
    metrics = task.episode_metrics(observations)
    assert metrics["success"] == 1.0 and metrics["final_distance"] < arm_push.SUCCESS_DISTANCE_M
    # a zero policy: the block never moves, no reward, a failure at full length
    observations, rewards, _ = _episode(device, task, lambda o, s: np.zeros(2, np.float32), seed=3)
    assert len(rewards) == task.max_episode_steps and not any(rewards)
    metrics = task.episode_metrics(observations)
    assert metrics["success"] == 0.0
    assert metrics["final_distance"] == pytest.approx(arm_push.xy_distance(observations[0]), abs=1e-4)


def test_a_random_policy_rarely_succeeds(pair):
    device, task = pair
    successes = [task.episode_metrics(_episode(device, task, _random_policy(seed), seed)[0])["success"]
                 for seed in range(EPISODES)]
    assert np.mean(successes) < 0.2


def test_the_person_corrects_a_random_policy_and_never_the_expert(pair):
    device, task = pair
    person = Person()
    acted = steps = 0
    for seed in range(EPISODES):
        _, rewards, n = _episode(device, task, _random_policy(seed), seed, person=person)
        acted, steps = acted + n, steps + len(rewards)
    assert acted / steps > 0.25, acted / steps
    assert person.interventions == acted
    for seed in range(EPISODES):
        _, rewards, n = _episode(device, task, expert, 100 + seed, person=person)
        assert n == 0, f"seed {100 + seed}: the person took over from the expert"


def test_the_person_holds_control_then_lets_go_and_starts_afresh_at_step_0(pair):
    device, _ = pair
    person = Person()
    o = device.reset(seed=0)
    assert person(o, 0) is None
    away = np.array([-1.0, 0.0], np.float32)  # straight away from the block (it lies ahead, x >= 0.42)
    who, action = [], None
    for step in range(1, 40):
        o = device.step(away if action is None else action)
        action = person(o, step)
        who.append(action)
    first = next(i for i, a in enumerate(who) if a is not None)
    taken = [a is not None for a in who[first:]]
    assert all(taken[:person.corridor.hold_steps])  # at least hold_steps steps
    assert not all(taken)  # ...then lets go once back in the corridor
    assert who[first].shape == (2,) and np.all(np.abs(who[first]) <= 1.0)
    assert person(device.reset(seed=1), 0) is None  # a new episode: state cleared


def test_the_person_is_a_teleop_script_source():
    from embodyrl.hal.teleop import make_source

    source = make_source("script:embodyrl.envs.arm_push:person", arm_push.ACTION_SPEC)
    source.new_episode()
    device, _ = arm_push.make()
    with device:
        assert source.poll(device.reset(seed=2)) is None


def test_the_camera_shows_the_block_where_it_is():
    target = dict(target_low=(0.6, 0.0), target_high=(0.6, 0.0))
    images = {}
    for y in (-0.08, 0.08):
        config = ArmPushConfig(camera=(48, 40), block_low=(0.45, y), block_high=(0.45, y), **target)
        device, _ = arm_push.make(config)
        spec = device.observation_spec[arm_push.CAMERA_FIELD]
        assert spec.shape == (40, 48, 3) and spec.dtype == np.uint8
        with device:
            image = device.reset(seed=0)[arm_push.CAMERA_FIELD]
        assert image.shape == (40, 48, 3) and image.dtype == np.uint8
        images[y] = image.astype(int)

    def centre(image, colour):
        r, g, b = image[..., 0], image[..., 1], image[..., 2]
        mask = (r > 150) & (g < 90) & (b < 90) if colour == "red" else (g > 120) & (r < 90) & (b < 90)
        rows, cols = np.nonzero(mask)
        assert len(cols) >= 2, f"no {colour} pixels"
        return rows.mean(), cols.mean()

    assert np.abs(images[-0.08] - images[0.08]).sum() > 0
    (row_a, col_a), (row_b, col_b) = centre(images[-0.08], "red"), centre(images[0.08], "red")
    assert col_b - col_a > 4 and abs(row_b - row_a) < 2  # the image's x axis is the world's y
    np.testing.assert_allclose(centre(images[-0.08], "green"), centre(images[0.08], "green"), atol=0.5)


def test_registered_as_arm_push():
    device, task = envs.make("arm_push")
    assert isinstance(task, arm_push.Push) and device.action_spec.shape == (2,)
    assert envs.GYMNASIUM_IDS["arm_push"][1] == task.max_episode_steps
