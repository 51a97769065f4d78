"""Any Gymnasium environment as a device plus a task.

``GymDevice(env)`` drives a ``gymnasium.Env`` as a :class:`Device`: a ``Box``
observation becomes one field named ``observation``, a ``Dict`` of boxes one
field per key; the action space must be a ``Box``. ``GymTask(device)`` gives
the environment's own reward and termination to the actor loop, and its
time limit (``env.spec.max_episode_steps``) as ``max_episode_steps``, so
termination and truncation stay distinct; an env that reports
``info["is_success"]`` gives the episode's success too.

The task reads what the device's last ``step`` returned, so it must be asked
in the loop's order: ``device.step(a)`` then ``task.reward(o, a, o')`` and
``task.terminated(o')``. The opposite direction, a device plus a task as a
Gymnasium env, is :class:`embodyrl.hal.gym_env.DeviceEnv`.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from ..device import Device
from ..specs import ArraySpec, DictSpec
from ..task import Task

OBSERVATION_FIELD = "observation"


def box_spec(name: str, space: spaces.Space) -> ArraySpec:
    """An :class:`ArraySpec` with the box's shape, dtype and bounds (none where all infinite)."""
    if not isinstance(space, spaces.Box):
        raise TypeError(f"{name}: only Box spaces map to arrays, got {type(space).__name__}")
    low = None if np.isneginf(space.low).all() else space.low
    high = None if np.isposinf(space.high).all() else space.high
    return ArraySpec(name, space.shape, space.dtype, low, high)


def observation_spec(space: spaces.Space) -> DictSpec:
    if isinstance(space, spaces.Dict):
        return DictSpec(tuple(box_spec(str(key), sub) for key, sub in space.spaces.items()))
    return DictSpec.of(box_spec(OBSERVATION_FIELD, space))


class GymDevice(Device):
    """A Gymnasium env behind the Device interface; it keeps the last reward and flags."""

    def __init__(self, env: gymnasium.Env, control_period_s: float | None = None):
        super().__init__()
        self.env = env
        self.observation_spec = observation_spec(env.observation_space)
        self.action_spec = box_spec("action", env.action_space)
        self._dict_obs = isinstance(env.observation_space, spaces.Dict)
        fps = env.metadata.get("render_fps")
        self.control_period_s = float(control_period_s or getattr(env.unwrapped, "dt", None)
                                      or (1.0 / fps if fps else 1.0))
        self.last_reward = 0.0
        self.last_terminated = False
        self.last_truncated = False
        self.last_info: dict[str, Any] = {}

    def _fields(self, observation) -> dict[str, np.ndarray]:
        # the env is the hardware here: its arrays take the dtypes its space declares
        if self._dict_obs:
            return {s.name: np.asarray(observation[s.name], s.dtype) for s in self.observation_spec.specs}
        spec = self.observation_spec[OBSERVATION_FIELD]
        return {OBSERVATION_FIELD: np.asarray(observation, spec.dtype)}

    def _reset(self, seed: int | None) -> dict[str, np.ndarray]:
        observation, self.last_info = self.env.reset(seed=seed)
        self.last_reward, self.last_terminated, self.last_truncated = 0.0, False, False
        return self._fields(observation)

    def _step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        observation, reward, terminated, truncated, self.last_info = self.env.step(action)
        self.last_reward = float(reward)
        self.last_terminated, self.last_truncated = bool(terminated), bool(truncated)
        return self._fields(observation)

    def _close(self) -> None:
        self.env.close()


class GymTask(Task):
    """The env's reward, termination and time limit, read from a :class:`GymDevice`."""

    def __init__(self, device: GymDevice):
        self.device = device
        spec = device.env.spec
        self.name = spec.id if spec is not None else type(device.env.unwrapped).__name__
        self.max_episode_steps = spec.max_episode_steps if spec is not None else None

    def reward(self, observation, action, next_observation) -> float:
        return self.device.last_reward

    def terminated(self, next_observation) -> bool:
        return self.device.last_terminated

    def truncated(self, next_observation) -> bool:
        """The env's own truncation (its time limit, or any other reason it gives)."""
        return self.device.last_truncated

    def episode_metrics(self, observations) -> dict[str, float]:
        """``success`` where the env's last step said (``info["is_success"]``, Gymnasium-Robotics' and
        Stable-Baselines3's convention), so a recording is labelled without asking a person."""
        info = self.device.last_info
        return {"success": float(bool(info["is_success"]))} if "is_success" in info else {}


def make(env_id: str, **kwargs) -> tuple[GymDevice, GymTask]:
    """(device, task) for a registered Gymnasium id, e.g. ``make("Pendulum-v1")``."""
    device = GymDevice(gymnasium.make(env_id, **kwargs))
    return device, GymTask(device)
