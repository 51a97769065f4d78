"""Pendulum swing-up on MuJoCo (the shipped ``assets/pendulum.xml``).

The rod starts anywhere (angle uniform in [-pi, pi], angular velocity uniform
in [-1, 1] rad/s) and must be brought to and held upright. The motor's
torque limit (2 N m by default) is well below the 4.9 N m that lifting the
rod from horizontal takes, so it must swing up. Observation: ``orientation``
= (cos angle, sin angle) and ``angular_velocity``, both float32; angle 0 is
upright. Reward, as Gymnasium's Pendulum-v1: ``-(angle^2 + 0.1 vel^2 +
0.001 torque^2)`` with the angle wrapped to [-pi, pi]. Episodes are
truncated after 200 control steps of 0.05 s (10 physics steps of 5 ms);
they never terminate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..hal.specs import ArraySpec, DictSpec
from ..hal.task import Task

ASSET = Path(__file__).with_name("assets") / "pendulum.xml"
UPRIGHT_RAD = 0.2
REWARD_BOUND = 1e5
"""The largest |reward| a swing-up step pays: theta**2 + 0.1 omega**2 + 0.001 u**2 is about 4,000 at
the rod's terminal speed (200 rad/s, where the joint's damping balances the full torque); the learner
refuses a row beyond it (:mod:`embodyrl.hal.steps`)."""

OBSERVATION_SPEC = DictSpec.of(
    ArraySpec("orientation", (2,), np.float32, -1.0, 1.0),
    ArraySpec("angular_velocity", (1,), np.float32),
)


@dataclass(frozen=True)
class PendulumConfig:
    torque_limit: float = 2.0
    """Largest motor torque in N m; lifting the rod from horizontal takes 4.9."""
    control_substeps: int = 10
    """Physics steps (5 ms each) per control step."""
    max_episode_steps: int = 200
    """Control steps before the episode is truncated (10 s)."""


def angle(observation: dict[str, np.ndarray]) -> float:
    """The rod's angle from upright, in [-pi, pi]."""
    cos, sin = observation["orientation"]
    return float(np.arctan2(sin, cos))


class SwingUp(Task):
    name = "pendulum"

    def __init__(self, config: PendulumConfig = PendulumConfig()):
        self.max_episode_steps = config.max_episode_steps

    def reward(self, observation, action, next_observation) -> float:
        theta = angle(observation)
        velocity = float(observation["angular_velocity"][0])
        torque = float(action[0])
        return -(theta**2 + 0.1 * velocity**2 + 0.001 * torque**2)

    def episode_metrics(self, observations) -> dict[str, float]:
        """Over the episode's second half: ``upright_fraction``, the share of steps within 0.2 rad of
        upright, and ``angle_error_median``, the median absolute angle (a pole held still just
        outside the band, or wobbling just inside it, shows here, not in the fraction)."""
        second_half = observations[len(observations) // 2:]
        if not second_half:
            return {"upright_fraction": 0.0, "angle_error_median": float(np.pi)}
        errors = np.abs([angle(o) for o in second_half])
        return {"upright_fraction": float(np.mean(errors < UPRIGHT_RAD)),
                "angle_error_median": float(np.median(errors))}


def observe(model, data) -> dict[str, np.ndarray]:
    theta = data.qpos[0]
    return {
        "orientation": np.array([np.cos(theta), np.sin(theta)], np.float32),
        "angular_velocity": np.array([data.qvel[0]], np.float32),
    }


def random_start(model, data, rng: np.random.Generator) -> None:
    data.qpos[0] = rng.uniform(-np.pi, np.pi)
    data.qvel[0] = rng.uniform(-1.0, 1.0)


def make_device(config: PendulumConfig = PendulumConfig()):
    from ..hal.drivers.mujoco import MujocoDevice, load_model

    model = load_model(ASSET)
    model.actuator_ctrlrange[0] = (-config.torque_limit, config.torque_limit)
    return MujocoDevice(model, control_substeps=config.control_substeps,
                        observation_fn=observe, observation_spec=OBSERVATION_SPEC,
                        reset_fn=random_start)


def make(config: PendulumConfig = PendulumConfig()):
    """(device, task) for the swing-up."""
    return make_device(config), SwingUp(config)
