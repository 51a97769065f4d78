"""An arm's kinematic model, read from MJCF (or URDF, through MuJoCo's loader): forward kinematics
of one site, its Jacobian, gravity torques, and damped least-squares inverse kinematics that stays
inside the joint limits.

The model is only computed with, never simulated: it has its own ``MjData``, so the same file can
describe a real arm (whose joints the robot reports) or the simulated one.

IK (:meth:`ArmModel.solve`) iterates ``dq = J^T (J J^T + lambda^2 I)^-1 e`` (the damping keeps a
step finite near a singularity), plus a small pull toward a rest posture in the Jacobian's null
space (a 7-joint arm reaching a point has a 4-dimensional family of solutions: without it the
elbow wanders), clips each iterate to the joint ranges, and stops when the error is below the
tolerance or stops shrinking.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

_MOVABLE = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))


@dataclass(frozen=True)
class IKResult:
    q: np.ndarray
    """Joint positions, inside the joint limits."""
    position_error_m: float
    orientation_error_rad: float
    iterations: int
    converged: bool


def rotation_error(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """The rotation vector taking ``current`` to ``target`` (3x3 rotation matrices), in the world frame."""
    quat = np.empty(4)
    mujoco.mju_mat2Quat(quat, (target @ current.T).reshape(-1))
    error = np.empty(3)
    mujoco.mju_quat2Vel(error, quat, 1.0)
    return error


class ArmModel:
    """The kinematics of ``joints`` (default: every hinge and slide joint, in model order) up to
    ``site``, the end effector."""

    def __init__(self, model: str | Path | mujoco.MjModel, site: str, joints: tuple[str, ...] | None = None,
                 rest: np.ndarray | None = None, limits: Mapping[str, tuple[float, float]] | None = None):
        """``limits``: joint name -> (low, high), tighter than the model's ranges (a soft limit: the
        arm folding into itself, say, which IK does not see)."""
        if isinstance(model, mujoco.MjModel):
            self.model = model
        else:
            path = Path(model)
            if not path.is_file():
                raise FileNotFoundError(f"kinematic model {path}: no such file (MJCF .xml or URDF .urdf)")
            self.model = mujoco.MjModel.from_xml_path(str(path))
        self.data = mujoco.MjData(self.model)
        self.site = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, site)
        if self.site < 0:
            sites = [mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_SITE, i) for i in range(self.model.nsite)]
            raise ValueError(f"site {site!r} is not in the model; it has {', '.join(map(str, sites)) or 'none'}")
        if joints is None:
            ids = [j for j in range(self.model.njnt) if self.model.jnt_type[j] in _MOVABLE]
        else:
            ids = []
            for name in joints:
                j = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)
                if j < 0 or self.model.jnt_type[j] not in _MOVABLE:
                    raise ValueError(f"joint {name!r} is not a hinge or slide joint of the model")
                ids.append(j)
        if not ids:
            raise ValueError("the model has no hinge or slide joint to move")
        self.joint_names = tuple(mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in ids)
        self._qpos = np.array([self.model.jnt_qposadr[j] for j in ids])
        self._dof = np.array([self.model.jnt_dofadr[j] for j in ids])
        limited = self.model.jnt_limited[ids].astype(bool)
        ranges = self.model.jnt_range[ids]
        self.lower = np.where(limited, ranges[:, 0], -np.inf)
        self.upper = np.where(limited, ranges[:, 1], np.inf)
        for name, (low, high) in (limits or {}).items():
            if name not in self.joint_names:
                raise ValueError(f"joint limit for {name!r}: not one of the arm's joints ({', '.join(self.joint_names)})")
            j = self.joint_names.index(name)
            self.lower[j], self.upper[j] = max(self.lower[j], low), min(self.upper[j], high)
            if self.lower[j] > self.upper[j]:
                raise ValueError(f"joint limit for {name!r}: ({low}, {high}) leaves nothing of the model's range")
        self.rest = np.clip(np.zeros(len(ids)) if rest is None else np.asarray(rest, np.float64),
                            self.lower, self.upper)
        self._jacp = np.zeros((3, self.model.nv))
        self._jacr = np.zeros((3, self.model.nv))

    @property
    def dof(self) -> int:
        return len(self._qpos)

    def _place(self, q) -> None:
        self.data.qpos[self._qpos] = q
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)

    def forward(self, q) -> tuple[np.ndarray, np.ndarray]:
        """The site's position (3,) and rotation matrix (3, 3) at joint positions ``q``."""
        self._place(q)
        return self.data.site_xpos[self.site].copy(), self.data.site_xmat[self.site].reshape(3, 3).copy()

    def jacobian(self, q) -> tuple[np.ndarray, np.ndarray]:
        """The site's positional and rotational Jacobians (3, dof each) at ``q``."""
        self._place(q)
        mujoco.mj_jacSite(self.model, self.data, self._jacp, self._jacr, self.site)
        return self._jacp[:, self._dof].copy(), self._jacr[:, self._dof].copy()

    def gravity(self, q) -> np.ndarray:
        """The joint torques that hold the arm still at ``q`` against gravity (the model's masses)."""
        self.data.qvel[:] = 0
        self._place(q)
        mujoco.mj_rne(self.model, self.data, 0, bias := np.zeros(self.model.nv))
        return bias[self._dof]

    def clip(self, q) -> np.ndarray:
        return np.clip(q, self.lower, self.upper)

    def solve(self, q0, position, rotation: np.ndarray | None = None, *, damping: float = 0.01,
              iterations: int = 50, tolerance_m: float = 1e-4, tolerance_rad: float = 1e-3,
              max_step_rad: float = 0.3, posture_gain: float = 0.2) -> IKResult:
        """Joint positions within the limits that put the site at ``position`` (and ``rotation``, a
        3x3 matrix, when given), starting from ``q0``. Unreachable targets end at the nearest the
        iteration finds (``converged`` False, the errors say how far)."""
        q = self.clip(np.asarray(q0, np.float64))
        position = np.asarray(position, np.float64)
        eye = np.eye(3 if rotation is None else 6)
        best = None
        for i in range(iterations + 1):
            pos, rot = self.forward(q)
            e_pos = position - pos
            e_rot = rotation_error(rotation, rot) if rotation is not None else np.zeros(3)
            p_err, r_err = float(np.linalg.norm(e_pos)), float(np.linalg.norm(e_rot))
            score = p_err + 0.1 * r_err
            if best is None or score < best[0]:
                best = (score, q.copy(), p_err, r_err)
            if p_err <= tolerance_m and r_err <= tolerance_rad:
                return IKResult(q, p_err, r_err, i, True)
            if i == iterations:
                break
            jacp, jacr = self.jacobian(q)
            jac, err = (jacp, e_pos) if rotation is None else (np.vstack([jacp, jacr]), np.concatenate([e_pos, e_rot]))
            free = np.ones(self.dof, bool)
            for _ in range(self.dof):  # a joint at a limit that the step pushes past it is held; the rest re-solve
                held = jac * free
                inverse = held.T @ np.linalg.inv(held @ held.T + damping**2 * eye)
                step = inverse @ err
                if i == 0:  # once per solve: a gentle pull that a controller calling each step accumulates
                    null = np.eye(self.dof) - np.linalg.pinv(held, rcond=1e-3) @ held  # leaves the error alone
                    step += (null @ (posture_gain * (self.rest - q))) * free
                blocked = free & (((q <= self.lower) & (step < 0)) | ((q >= self.upper) & (step > 0)))
                if not blocked.any():
                    break
                free &= ~blocked
            largest = np.abs(step).max()
            if largest > max_step_rad:
                step *= max_step_rad / largest
            q = self.clip(q + step)
        _, q, p_err, r_err = best
        return IKResult(q, p_err, r_err, iterations, False)

    def joints_of(self, qpos: np.ndarray) -> np.ndarray:
        """This arm's joint positions out of a whole model's ``qpos`` (the simulated device's observation)."""
        return np.asarray(qpos, np.float64)[self._qpos]

    def velocities_of(self, qvel: np.ndarray) -> np.ndarray:
        return np.asarray(qvel, np.float64)[self._dof]
