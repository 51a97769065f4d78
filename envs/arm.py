"""Reaching with a 7-DoF torque-controlled arm (the shipped ``assets/arm7.xml``).

The arm starts near upright with small random joint offsets; a target is
drawn uniformly in a box in front of it (x 0.3..0.6 m, y -0.3..0.3 m, z
0.3..0.8 m). Observation: ``qpos`` and ``qvel`` (7 each), ``ee_pos`` and
``target_pos`` (3 each). Action: seven joint torques within each motor's
range. Control at 50 Hz (10 physics steps of 2 ms); episodes are truncated
after 250 steps (5 s). Reward (a :class:`~embodyrl.hal.rewards.Shaped`
sum): ``-|ee - target| - 1e-4 |torque / limit|^2``; an episode's
``success`` (a :class:`~embodyrl.hal.rewards.Success` detector) is the end
effector within 5 cm of the target at its end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..hal.rewards import Shaped, Success, Term, distance, within_distance
from ..hal.task import Task

ASSET = Path(__file__).with_name("assets") / "arm7.xml"
SUCCESS_DISTANCE_M = 0.05
REWARD_BOUND = 100.0
"""The largest |reward| a reach step pays, with a wide margin: the hand's distance to the target (a
metre or two at most) plus 1e-4 of the clipped effort (at most 7)."""


@dataclass(frozen=True)
class ArmConfig:
    control_substeps: int = 10
    max_episode_steps: int = 250
    joint_noise_rad: float = 0.1
    """Half-width of the uniform noise on the initial joint angles."""


def _effort(limits: np.ndarray):
    def effort(observation, action, next_observation) -> float:
        return float(np.sum((np.asarray(action) / limits) ** 2))
    return effort


class Reach(Task):
    name = "arm_reach"

    def __init__(self, config: ArmConfig = ArmConfig(), torque_limits: np.ndarray | None = None):
        self.max_episode_steps = config.max_episode_steps
        self.torque_limits = np.ones(7) if torque_limits is None else np.asarray(torque_limits)
        ee_to_target = distance("ee_pos", "target_pos")
        self.shaped = Shaped((
            Term("distance", -1.0, lambda o, a, next_o: ee_to_target(next_o)),
            Term("effort", -1e-4, _effort(self.torque_limits)),
        ))
        self.success = Success(within_distance("ee_pos", "target_pos", SUCCESS_DISTANCE_M))

    def reward(self, observation, action, next_observation) -> float:
        return self.shaped(observation, action, next_observation)

    def episode_metrics(self, observations) -> dict[str, float]:
        last = observations[-1]
        return {"final_distance": float(np.linalg.norm(last["ee_pos"] - last["target_pos"])),
                "success": self.success(last, None, last)}


def make_device(config: ArmConfig = ArmConfig()):
    from ..hal.drivers.mujoco import MujocoDevice

    def reset(model, data, rng):
        data.qpos[:] = rng.uniform(-config.joint_noise_rad, config.joint_noise_rad, model.nq)
        data.mocap_pos[0] = rng.uniform([0.3, -0.3, 0.3], [0.6, 0.3, 0.8])

    return MujocoDevice(ASSET, control_substeps=config.control_substeps, reset_fn=reset)


def make(config: ArmConfig = ArmConfig()):
    device = make_device(config)
    return device, Reach(config, torque_limits=device.action_spec.maximum)
