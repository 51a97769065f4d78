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

import functools
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


def make_device(config: ArmConfig = ArmConfig(), *, control_substeps: int | None = None):
    """The simulated arm, driven by joint torques; ``control_substeps`` physics steps per control
    period (default: the config's)."""
    from ..hal.drivers.mujoco import MujocoDevice

    def reset(model, data, rng):
        data.qpos[:] = rng.uniform(-config.joint_noise_rad, config.joint_noise_rad, model.nq)
        data.mocap_pos[0] = rng.uniform([0.3, -0.3, 0.3], [0.6, 0.3, 0.8])

    substeps = config.control_substeps if control_substeps is None else control_substeps
    return MujocoDevice(ASSET, control_substeps=substeps, reset_fn=reset)


def make(config: ArmConfig = ArmConfig()):
    device = make_device(config)
    return device, Reach(config, torque_limits=device.action_spec.maximum)


PD_SUBSTEPS = 5
"""Joint PD steps per end-effector action: the PD at 250 Hz, the policy at 50 Hz as in the joint task."""
END_EFFECTOR = dict(
    model=str(ASSET), site="ee", workspace_low=(-0.2, -0.6, 0.15), workspace_high=(0.8, 0.6, 1.4),
    max_step_m=0.03, kp=(600.0, 600.0, 300.0, 300.0, 60.0, 60.0, 30.0), kd=(40.0, 40.0, 20.0, 20.0, 4.0, 4.0, 2.0),
    substeps=PD_SUBSTEPS, rest=(0.0, 0.4, 0.0, -1.2, 0.0, 0.8, 0.0), joint_limits=(("j4", -1.6, 0.1), ("j6", -2.0, 2.0)))
"""The end-effector layer of the reach arm (``examples/robots/arm_ee.yaml`` declares the same): the hand
moves up to 3 cm per 20 ms period inside a box around the targets' region; the elbow and wrist bend
at most as far as the links clear each other (further, IK's answer folds the arm into itself)."""


def make_ee_device(config: ArmConfig = ArmConfig()):
    """The arm driven by end-effector moves (:class:`~embodyrl.hal.end_effector.EndEffectorDevice`)."""
    from ..hal.end_effector import EndEffectorConfig, EndEffectorDevice

    if config.control_substeps % PD_SUBSTEPS:
        raise ValueError(f"control_substeps {config.control_substeps} is not a multiple of {PD_SUBSTEPS}")
    inner = make_device(config, control_substeps=config.control_substeps // PD_SUBSTEPS)
    return EndEffectorDevice(inner, EndEffectorConfig(**END_EFFECTOR))


def make_ee(config: ArmConfig = ArmConfig()):
    """Reaching with end-effector moves: the same arm, targets, reward and success as :func:`make`."""
    return make_ee_device(config), Reach(config, torque_limits=np.ones(3))  # effort: the squared moves


def expert(observation, step: int = 0) -> np.ndarray:
    """A scripted expert for the end-effector reach (``script:embodyrl.envs.arm:expert``): the
    hand straight at the target, at full speed until the last few centimetres."""
    offset = np.asarray(observation["target_pos"], np.float64) - np.asarray(observation["ee_pos"], np.float64)
    return np.clip(offset / END_EFFECTOR["max_step_m"], -1.0, 1.0).astype(np.float32)


_JOINT_EXPERT_GAINS = (0.4, 0.6)
"""The expert's PD gains as fractions of the end-effector layer's: its torque is held for the whole
20 ms period (the layer's PD runs five times in it), so it must be gentler."""


def arm_model():
    """The arm's kinematics as the end-effector layer sees them: its rest posture and soft limits."""
    from ..hal.kinematics import ArmModel

    return ArmModel(ASSET, "ee", rest=END_EFFECTOR["rest"],
                    limits={name: (low, high) for name, low, high in END_EFFECTOR["joint_limits"]})


_expert_arm = functools.cache(arm_model)


def joint_expert(observation, step: int = 0) -> np.ndarray:
    """A scripted expert for the joint-torque reach (``script:embodyrl.envs.arm:joint_expert``, also
    for ``examples/robots/arm.yaml``): :func:`expert`'s hand move, through IK, as joint torques of a PD
    plus gravity compensation (clipped to the motors' ranges by the device)."""
    arm = _expert_arm()
    q, dq = np.asarray(observation["qpos"], np.float64), np.asarray(observation["qvel"], np.float64)
    target = np.asarray(observation["ee_pos"], np.float64) + expert(observation) * END_EFFECTOR["max_step_m"]
    q_target = arm.solve(q, target, iterations=20).q
    kp, kd = (np.asarray(END_EFFECTOR[k]) * g for k, g in zip(("kp", "kd"), _JOINT_EXPERT_GAINS, strict=True))
    return (kp * (q_target - q) - kd * dq + arm.gravity(q)).astype(np.float32)
