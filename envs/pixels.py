"""Pendulum swing-up seen through a camera: the pixel-observation task.

The device is the shipped pendulum with its ``front`` camera rendered
offscreen at 84 x 84 (``camera/front``, uint8 HxWx3) next to the state
fields. The reward is the swing-up's, computed from the state fields (a
task may read what the policy does not); a pixels-only learner drops the
state fields from its network input. Used by tests and the rendering
benchmark; rendering goes through OSMesa on a headless machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import pendulum

CAMERA = "front"


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


def make_device(config: PixelsConfig = PixelsConfig()):
    from ..hal.drivers.mujoco import MujocoDevice, load_model

    model = load_model(pendulum.ASSET)
    model.actuator_ctrlrange[0] = (-config.pendulum.torque_limit, config.pendulum.torque_limit)
    return MujocoDevice(model, control_substeps=config.pendulum.control_substeps,
                        observation_fn=pendulum._observe, observation_spec=pendulum.OBSERVATION_SPEC,
                        reset_fn=pendulum._random_start,
                        cameras={CAMERA: (config.width, config.height)},
                        camera_effects=config.camera_effects)


def make(config: PixelsConfig = PixelsConfig()):
    """(device, task) for the swing-up with an image observation."""
    return make_device(config), pendulum.SwingUp(config.pendulum)
