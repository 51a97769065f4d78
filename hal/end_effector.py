"""End-effector actions over a joint-space arm: a :class:`Device` wrapper.

A policy, or a person at a keyboard, gamepad or spacemouse, moves the hand, not the joints. Each
action element is in [-1, 1]: the first three move the end effector by up to ``max_step_m`` along
x, y, z (world frame) in one control period; with ``max_turn_rad`` three more turn it about x, y,
z; with ``gripper`` a last one drives that actuator across its range. Each step then:

1. adds the move to the hand's measured pose (forward kinematics of the joints the arm reports),
   clipped to the ``workspace`` box: the Cartesian rate limit and bounds (a command never runs
   ahead of the hand by more than one move, so nothing winds up while the arm is held back);
2. solves damped least-squares IK from the measured joints, within the joint limits
   (:class:`~.kinematics.ArmModel`);
3. commands the joints: ``command="position"`` sends the joint targets (an arm with its own joint
   controller), ``command="torque"`` runs a joint PD controller, ``kp (q* - q) - kd dq`` plus the
   model's gravity torques, for ``substeps`` steps of the inner device (the PD's rate is the inner
   device's; the policy's period is ``substeps`` of them), clipped to the actuators' ranges.

Zero is the safe action: hold the hand where it is. The observation is the inner device's, plus
``ee_pos`` (forward kinematics) where the arm does not report it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .device import Device, Health
from .specs import ArraySpec, DictSpec

EE_FIELD = "ee_pos"
COMMANDS = ("torque", "position")


@dataclass(frozen=True)
class EndEffectorConfig:
    model: str | Path
    """The arm's kinematic model: MJCF (.xml) or URDF (.urdf)."""
    site: str
    """The model's site at the end effector."""
    workspace_low: tuple[float, float, float]
    workspace_high: tuple[float, float, float]
    """The box (world frame, m) the commanded hand position stays in."""
    max_step_m: float = 0.02
    """How far the hand may be commanded in one control period (action 1.0)."""
    max_turn_rad: float | None = None
    """With a value, three more action elements turn the hand by up to this much per period."""
    command: str = "torque"
    kp: float | tuple[float, ...] = 100.0
    kd: float | tuple[float, ...] = 10.0
    """Joint PD gains (per joint or one for all), ``command="torque"`` only."""
    substeps: int = 1
    """Inner device steps per action; the PD runs at the inner device's rate."""
    gravity_compensation: bool = True
    joints: tuple[str, ...] | None = None
    """The model's joints the inner device's action drives, in its order (default: every hinge and
    slide joint)."""
    joint_positions: str = "qpos"
    joint_velocities: str = "qvel"
    """Observation fields with the joints' positions and velocities (the arm's joints only, or the
    whole model's ``qpos``/``qvel`` in a simulation of that same model)."""
    gripper: int | None = None
    """Index of the inner action element driving a gripper (the last action element)."""
    rest: tuple[float, ...] | None = None
    """A posture IK pulls toward in its null space (default: all joints at zero, within limits)."""
    joint_limits: tuple[tuple[str, float, float], ...] = ()
    """(joint, low, high): IK's limits tighter than the model's (where the arm would fold into itself)."""


class EndEffectorDevice(Device):
    """``inner`` (joint torques or joint positions) driven by end-effector moves."""

    def __init__(self, inner: Device, config: EndEffectorConfig):
        super().__init__()
        if config.command not in COMMANDS:
            raise ValueError(f"command: {config.command!r}, expected one of {', '.join(COMMANDS)}")
        if config.substeps < 1 or config.max_step_m <= 0:
            raise ValueError("substeps must be >= 1 and max_step_m > 0")
        from .kinematics import ArmModel  # MuJoCo (the mujoco extra): only to build one

        self.inner, self.config = inner, config
        self.arm = ArmModel(config.model, config.site, config.joints, config.rest,
                            {name: (low, high) for name, low, high in config.joint_limits})
        n = self.arm.dof
        spec = inner.action_spec
        joint_elements = [i for i in range(spec.shape[0]) if i != config.gripper]
        if spec.shape != (n + (config.gripper is not None),):
            raise ValueError(f"the inner device takes {spec.shape[0]} action elements; the model's arm has {n} "
                             f"joints{' plus a gripper' if config.gripper is not None else ''}")
        self._joint_elements = np.array(joint_elements)
        self._low, self._high = (np.asarray(bound, np.float64) for bound in spec.limits)
        if config.gripper is not None and not np.isfinite([self._low[config.gripper], self._high[config.gripper]]).all():
            raise ValueError(f"gripper: action element {config.gripper} has no finite range to map [-1, 1] onto")
        self._kp = np.broadcast_to(np.asarray(config.kp, np.float64), (n,))
        self._kd = np.broadcast_to(np.asarray(config.kd, np.float64), (n,))
        self._box = (np.asarray(config.workspace_low, np.float64), np.asarray(config.workspace_high, np.float64))
        if self._box[0].shape != (3,) or self._box[1].shape != (3,) or (self._box[0] > self._box[1]).any():
            raise ValueError(f"workspace: low {config.workspace_low} and high {config.workspace_high} must be "
                             "three numbers each, low <= high")
        size = 3 + 3 * (config.max_turn_rad is not None) + (config.gripper is not None)
        self.action_spec = ArraySpec("action", (size,), np.float32, -np.ones(size), np.ones(size))
        fields = inner.observation_spec
        for name in (config.joint_positions, config.joint_velocities):
            if name not in fields:
                raise ValueError(f"the inner device observes no {name!r} (it has {', '.join(fields)})")
        self._adds_ee = EE_FIELD not in fields
        self.observation_spec = (DictSpec((*fields.specs, ArraySpec(EE_FIELD, (3,), np.float32)))
                                 if self._adds_ee else fields)
        self.control_period_s = inner.control_period_s * config.substeps
        self.safe_action = np.zeros(size, np.float32)
        self._observation: dict[str, np.ndarray] | None = None
        self._hand: tuple[np.ndarray, np.ndarray] | None = None
        """The hand's (position, rotation) at ``_observation``, once computed."""
        self.last_target: np.ndarray | None = None
        """The hand position the last step commanded (inside the workspace box)."""

    # -- the arm's state ---------------------------------------------------------------
    def _joints(self, observation) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(observation[self.config.joint_positions], np.float64)
        dq = np.asarray(observation[self.config.joint_velocities], np.float64)
        if q.shape[0] != self.arm.dof:  # a simulation's whole qpos/qvel
            q, dq = self.arm.joints_of(q), self.arm.velocities_of(dq)
        return q, dq

    def _observed(self, observation) -> dict[str, np.ndarray]:
        """The observation returned, and the hand's pose in it (the next step moves from there)."""
        self._observation = observation
        self._hand = self.arm.forward(self._joints(observation)[0])
        if not self._adds_ee:
            return observation
        return {**observation, EE_FIELD: self._hand[0].astype(np.float32)}

    # -- Device hooks ------------------------------------------------------------------
    def _connect(self) -> None:
        self.inner.connect()

    def _close(self) -> None:
        self.inner.close()

    def _reset(self, seed):
        self.last_target = None
        return self._observed(self.inner.reset(seed))

    def _step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        config = self.config
        q, _ = self._joints(self._observation)
        position, rotation = self._hand if self._hand is not None else self.arm.forward(q)
        target = np.clip(position + np.clip(action[:3], -1, 1) * config.max_step_m, *self._box)
        target_rotation = None
        if config.max_turn_rad is not None:
            turn = np.clip(action[3:6], -1, 1) * config.max_turn_rad
            target_rotation = _rotation(turn) @ rotation
        self.last_target = target
        q_target = self.arm.solve(q, target, target_rotation, iterations=20).q
        command = np.zeros(self.inner.action_spec.shape, np.float64)
        if config.gripper is not None:
            g = (float(np.clip(action[-1], -1, 1)) + 1) / 2
            command[config.gripper] = self._low[config.gripper] + g * (self._high[config.gripper] - self._low[config.gripper])
        observation = self._observation
        for _ in range(config.substeps):
            if config.command == "position":
                command[self._joint_elements] = q_target
            else:
                q, dq = self._joints(observation)
                torque = self._kp * (q_target - q) - self._kd * dq
                if config.gravity_compensation:
                    torque += self.arm.gravity(q)
                command[self._joint_elements] = torque
            command = np.clip(command, self._low, self._high)
            observation = self.inner.step(command.astype(self.inner.action_spec.dtype))
            self._observation, self._hand = observation, None  # a fault before the last substep keeps this one
        return self._observed(observation)

    def _health(self) -> Health:
        return self.inner.health()

    def _on_estop(self) -> None:
        self.inner.estop(self._estop_reason or "e-stop")

    def clear_estop(self) -> None:
        super().clear_estop()
        self.inner.clear_estop()


def _rotation(rotvec: np.ndarray) -> np.ndarray:
    """The rotation matrix of a rotation vector (Rodrigues)."""
    angle = float(np.linalg.norm(rotvec))
    if angle < 1e-12:
        return np.eye(3)
    k = rotvec / angle
    cross = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(angle) * cross + (1 - np.cos(angle)) * cross @ cross
