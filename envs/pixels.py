"""Pendulum swing-up seen through a camera: the pixel-observation task.

The device is the shipped pendulum with its ``front`` camera rendered
offscreen at 84 x 84 (``camera/front``, uint8 HxWx3) next to the state
fields. The reward is the swing-up's, computed from the state fields (a
task may read what the policy does not); a pixels-only learner drops the
state fields from its network input. Used by tests and the rendering
benchmark; rendering goes through OSMesa on a headless machine.

One frame shows where the rod is, not how fast it turns: a pixels-only
learner needs several. ``pendulum_pixels_stacked`` (:func:`make_stacked`)
keeps the last ``frames`` images stacked on the channel axis of the same
field (84 x 84 x 9 for three frames, as DrQ stacks them); on reset the
first image fills every slot.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from ..hal.device import Device
from ..hal.specs import DictSpec
from . import pendulum

CAMERA = "front"
CAMERA_FIELD = f"camera/{CAMERA}"
REWARD_BOUND = pendulum.REWARD_BOUND
"""The swing-up's reward, so its bound."""


@dataclass(frozen=True)
class PixelsConfig:
    width: int = 84
    """Image width in pixels."""
    height: int = 84
    """Image height in pixels."""
    camera_effects: bool = False
    """Shadows, reflections, skybox: realism at ~15x the cost in software GL."""
    pendulum: pendulum.PendulumConfig = pendulum.PendulumConfig()
    """The underlying swing-up (torque limit, substeps, episode length)."""
    frames: int = 1
    """Consecutive images stacked on the channel axis (1: the camera's image as is)."""


def make_device(config: PixelsConfig = PixelsConfig()):
    from ..hal.drivers.mujoco import MujocoDevice, load_model

    model = load_model(pendulum.ASSET)
    model.actuator_ctrlrange[0] = (-config.pendulum.torque_limit, config.pendulum.torque_limit)
    return MujocoDevice(model, control_substeps=config.pendulum.control_substeps,
                        observation_fn=pendulum.observe, observation_spec=pendulum.OBSERVATION_SPEC,
                        reset_fn=pendulum.random_start,
                        cameras={CAMERA: (config.width, config.height)},
                        camera_effects=config.camera_effects)


class FrameStack(Device):
    """A device whose image field holds its last ``frames`` images, stacked on the channel axis."""

    def __init__(self, device: Device, field: str, frames: int):
        super().__init__()
        if frames < 1:
            raise ValueError(f"frames must be at least 1, got {frames}")
        self.device, self.field, self.frames = device, field, frames
        image = device.observation_spec[field]
        height, width, channels = image.shape
        def tile(bound):
            return None if bound is None else np.concatenate([bound] * frames, axis=-1)

        stacked = replace(image, shape=(height, width, channels * frames),
                          minimum=tile(image.minimum), maximum=tile(image.maximum))
        self.observation_spec = DictSpec(tuple(stacked if s.name == field else s
                                               for s in device.observation_spec.specs))
        self.action_spec = device.action_spec
        self.control_period_s = device.control_period_s
        self._images: deque[np.ndarray] = deque(maxlen=frames)

    @property
    def model(self):
        return self.device.model

    @property
    def data(self):
        return self.device.data

    def _connect(self) -> None:
        self.device.connect()

    def _close(self) -> None:
        self.device.close()

    def _stacked(self, observation: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._images.append(observation[self.field])
        return {**observation, self.field: np.concatenate(list(self._images), axis=-1)}

    def _reset(self, seed):
        observation = self.device.reset(seed)
        self._images.extend([observation[self.field]] * self.frames)
        return self._stacked(observation)

    def _step(self, action):
        return self._stacked(self.device.step(action))

    def _health(self):
        return self.device.health()

    def _on_estop(self) -> None:
        self.device.estop(self._estop_reason or "e-stop")


def make(config: PixelsConfig = PixelsConfig()):
    """(device, task) for the swing-up with an image observation."""
    device = make_device(config)
    if config.frames > 1:
        device = FrameStack(device, CAMERA_FIELD, config.frames)
    return device, pendulum.SwingUp(config.pendulum)


def make_stacked(frames: int = 3):
    """(device, task) with the last ``frames`` images stacked: what a pixels-only policy needs."""
    return make(PixelsConfig(frames=frames))
