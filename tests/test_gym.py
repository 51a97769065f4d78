"""Gymnasium both ways: any env as a device + task, any device + task as an env."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import embodyrl.hal.drivers.mujoco  # noqa: F401  (chooses headless GL before gymnasium imports mujoco)
from embodyrl import envs
from embodyrl.hal.drivers.gymnasium import GymDevice, GymTask, make
from embodyrl.hal.gym_env import DeviceEnv
from embodyrl.hal.testing import DeviceConformance


def _rollout_gym(env, seed, actions):
    obs, _ = env.reset(seed=seed)
    out = [(obs, 0.0, False, False)]
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        out.append((obs, r, term, trunc))
        if term or trunc:
            break
    return out


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "InvertedPendulum-v5"])
def test_gym_env_round_trips_through_device_and_task(env_id):
    reference = gym.make(env_id)
    rng = np.random.default_rng(0)
    actions = [reference.action_space.low + rng.random(reference.action_space.shape) *
               (reference.action_space.high - reference.action_space.low) for _ in range(300)]
    actions = [a.astype(reference.action_space.dtype) for a in actions]  # as the space declares
    expected = _rollout_gym(reference, 3, actions)
    device, task = make(env_id)
    wrapped = DeviceEnv(device, task)
    got = _rollout_gym(wrapped, 3, actions)
    assert len(got) == len(expected)
    for (o1, r1, te1, tr1), (o2, r2, te2, tr2) in zip(expected, got, strict=True):
        np.testing.assert_array_equal(o1, o2)
        assert (r1, te1, tr1) == (r2, te2, tr2)
    last = got[-1]
    if env_id == "Pendulum-v1":  # never terminates; the time limit truncates at 200
        assert len(got) == 201 and last[3] and not last[2]
    else:  # falls over long before the time limit: terminated, not truncated
        assert last[2] and not last[3] and len(got) < 100
    check_env(DeviceEnv(*make(env_id)), skip_render_check=True)
    wrapped.close()


def test_our_task_round_trips_through_a_gym_env():
    direct, task = envs.make("pendulum")
    through = GymDevice(DeviceEnv(*envs.make("pendulum")))
    gym_task = GymTask(through)
    assert through.observation_spec == direct.observation_spec
    assert gym_task.max_episode_steps is None  # a DeviceEnv is not registered: the loop's task limit applies
    with direct, through:
        a, b = direct.reset(seed=4), through.reset(seed=4)
        for _ in range(50):
            action = np.array([1.5], np.float32)
            a2, b2 = direct.step(action), through.step(action)
            assert task.reward(a, action, a2) == pytest.approx(gym_task.reward(b, action, b2))
            a, b = a2, b2
            for name in a:
                np.testing.assert_array_equal(a[name], b[name])


def test_gym_task_keeps_termination_and_truncation_apart():
    device, task = make("InvertedPendulum-v5")
    assert task.max_episode_steps == 1000 and task.name == "InvertedPendulum-v5"
    with device:
        obs = device.reset(seed=0)
        rewards = []
        for _ in range(200):
            nxt = device.step(np.full(1, 3.0, np.float32))
            rewards.append(task.reward(obs, np.zeros(1), nxt))
            if task.terminated(nxt):
                break
        assert task.terminated(nxt) and not task.truncated(nxt)
        # v5 pays 1 per step upright and 0 on the step that falls: the env's reward, as is
        assert rewards[:-1] == [1.0] * (len(rewards) - 1) and rewards[-1] == 0.0 == device.last_reward


def test_dict_observations_become_fields():
    inner = gym.make("Pendulum-v1")
    env = gym.wrappers.TransformObservation(
        inner, lambda o: {"cos_sin": o[:2], "velocity": o[2:]},
        gym.spaces.Dict({"cos_sin": gym.spaces.Box(-1, 1, (2,), np.float32),
                         "velocity": gym.spaces.Box(-8, 8, (1,), np.float32)}))
    device = GymDevice(env)
    assert list(device.observation_spec) == ["cos_sin", "velocity"]
    with device:
        obs = device.reset(seed=0)
        assert obs["velocity"].shape == (1,)
    round_trip = DeviceEnv(GymDevice(env), GymTask(GymDevice(env)))
    assert isinstance(round_trip.observation_space, gym.spaces.Dict)


def test_non_box_action_spaces_are_refused_by_name():
    with pytest.raises(TypeError, match="action.*Discrete"):
        GymDevice(gym.make("CartPole-v1"))


@pytest.mark.parametrize("task_name", ["pendulum", "arm_reach"])
def test_check_env_passes_on_our_tasks(task_name):
    env = DeviceEnv(*envs.make(task_name))
    check_env(env, skip_render_check=True)
    env.close()


def test_check_env_passes_with_pixels_and_renders():
    env = DeviceEnv(*envs.make("pendulum_pixels"), render_mode="rgb_array")
    assert isinstance(env.observation_space, gym.spaces.Dict)
    assert env.observation_space["camera/front"].dtype == np.uint8
    check_env(env)
    env.reset(seed=0)
    assert env.render().shape == (84, 84, 3)
    env.close()


def test_device_env_truncates_at_the_task_limit_and_clips_actions():
    device, task = envs.make("pendulum")
    env = DeviceEnv(device, task)
    env.reset(seed=0)
    flags = [env.step(np.array([100.0]))[2:4] for _ in range(task.max_episode_steps)]
    assert flags[-1] == (False, True) and not any(any(f) for f in flags[:-1])
    assert device.data.ctrl[0] == pytest.approx(2.0)  # clipped to the torque limit
    env.close()


class TestGymDeviceConformance(DeviceConformance):
    @pytest.fixture
    def device(self):
        with GymDevice(gym.make("Pendulum-v1")) as d:
            yield d


class TestGymMujocoDeviceConformance(DeviceConformance):
    @pytest.fixture
    def device(self):
        with GymDevice(gym.make("InvertedPendulum-v5")) as d:
            yield d
