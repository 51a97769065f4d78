"""A device plus a task as a ``gymnasium.Env``, so Gymnasium's tools plug in.

``DeviceEnv(device, task)``: one observation field becomes a ``Box``, several
a ``Dict`` of boxes (uint8 images stay uint8 boxes in [0, 255]); the action
spec becomes a ``Box``. ``step`` clips the action into the spec (as the actor
loop does), asks the task for the reward and termination, and truncates at
the task's ``max_episode_steps``: termination and truncation stay distinct.
``render()`` (``render_mode="rgb_array"``) returns the first camera image.
The device is connected on construction and closed by ``close()``.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces

from .device import Device
from .specs import ArraySpec
from .task import Task


def box(spec: ArraySpec) -> spaces.Box:
    low = -np.inf if spec.minimum is None else spec.minimum
    high = np.inf if spec.maximum is None else spec.maximum
    if spec.dtype.kind in "iu":
        info = np.iinfo(spec.dtype)
        low = np.clip(np.broadcast_to(low, spec.shape), info.min, info.max).astype(spec.dtype)
        high = np.clip(np.broadcast_to(high, spec.shape), info.min, info.max).astype(spec.dtype)
    else:
        low = np.broadcast_to(np.asarray(low, spec.dtype), spec.shape)
        high = np.broadcast_to(np.asarray(high, spec.dtype), spec.shape)
    return spaces.Box(low, high, spec.shape, spec.dtype)


class DeviceEnv(gymnasium.Env):
    """Gymnasium's interface over a HAL device and task."""

    def __init__(self, device: Device, task: Task, render_mode: str | None = None):
        self.device, self.task = device, task
        device.connect()
        specs = device.observation_spec.specs
        self._single = specs[0].name if len(specs) == 1 else None
        self.observation_space = (box(specs[0]) if self._single is not None
                                  else spaces.Dict({s.name: box(s) for s in specs}))
        self.action_space = box(device.action_spec)
        self._images = [s.name for s in specs if s.dtype == np.uint8 and len(s.shape) == 3 and s.shape[2] == 3]
        self.metadata = {"render_modes": ["rgb_array"] if self._images else [],
                         "render_fps": 1.0 / device.control_period_s}
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} not supported; supported: {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self._observation: dict[str, np.ndarray] | None = None
        self._t = 0

    def _out(self, observation: dict[str, np.ndarray]):
        return observation[self._single] if self._single is not None else dict(observation)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._observation = self.device.reset(seed)
        self._t = 0
        return self._out(self._observation), {}

    def step(self, action):
        if self._observation is None:
            raise RuntimeError("call reset() before step()")
        applied = self.device.action_spec.clip(np.asarray(action, np.float64).reshape(self.device.action_spec.shape))
        observation = self.device.step(applied)
        reward = float(self.task.reward(self._observation, applied, observation))
        terminated = bool(self.task.terminated(observation))
        self._t += 1
        limit = self.task.max_episode_steps
        truncated = bool(getattr(self.task, "truncated", lambda o: False)(observation)) or \
            (limit is not None and self._t >= limit)
        self._observation = observation
        return self._out(observation), reward, terminated, truncated and not terminated, {}

    def render(self):
        if self.render_mode != "rgb_array" or self._observation is None:
            return None
        return np.array(self._observation[self._images[0]])

    def close(self) -> None:
        self.device.close()
