"""The simulated arm speaking LeRobot's ``Robot`` interface: LeRobot's path tried without hardware.

:class:`SimulatedFollower` is the 7-joint arm of ``assets/arm7.xml`` as a
position-controlled follower arm, shaped like LeRobot's SO-101 follower:
``j1.pos`` ... ``j7.pos`` in degrees are both its observation features and
its action features (joint targets that a PD with gravity compensation
tracks, as the servos of a real arm do), and each camera named in
``cameras`` adds a ``(height, width, 3)`` frame of the model's camera of
that name. It has LeRobot's methods (``connect``, ``get_observation``,
``send_action``, ``disconnect``, the feature properties, ``is_connected``,
``is_calibrated``) without importing LeRobot, so a robot file drives it
exactly as it drives a LeRobot robot (``device: {factory:
embodyrl.envs.lerobot_arm:follower, bounds: ...}``, or registered as a
LeRobot type); it keeps no episode state of its own: like a real arm, it
is where the last command left it.

:class:`ScriptedLeader` is a person at a leader arm, shaped like LeRobot's
``Teleoperator``: it rests, moves to :data:`GOAL` over a second, and holds
there, then does it again, at each ``get_action`` call. :func:`pose_task`
rewards reaching :data:`GOAL`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..hal.task import Task

ASSET = Path(__file__).with_name("assets") / "arm7.xml"
JOINTS = tuple(f"j{i}" for i in range(1, 8))
NAMES = tuple(f"{j}.pos" for j in JOINTS)
HOME = dict(zip(NAMES, (0.0, 23.0, 0.0, -69.0, 0.0, 46.0, 0.0), strict=True))
"""The rest pose (degrees): the reach arm's end-effector rest posture."""
GOAL = dict(zip(NAMES, (30.0, 45.0, 0.0, -60.0, 0.0, 40.0, 0.0), strict=True))
BOUNDS = dict(zip(NAMES, ((-90, 90), (-60, 90), (-90, 90), (-130, 0), (-90, 90), (-90, 90), (-90, 90)), strict=True))
"""Joint limits to declare in a robot file (degrees): inside the model's own ranges."""
KP = (600.0, 600.0, 300.0, 300.0, 60.0, 60.0, 30.0)
KD = (40.0, 40.0, 20.0, 20.0, 4.0, 4.0, 2.0)
SUCCESS_DEG = 5.0


class _Uncalibrated:
    """What a LeRobot device says of calibration when it has none to do."""

    @property
    def is_calibrated(self) -> bool:
        return True

    def calibrate(self) -> None:
        """Nothing to calibrate in a simulation."""

    def configure(self) -> None:
        """Nothing to configure in a simulation."""


class SimulatedFollower(_Uncalibrated):
    """The simulated arm with LeRobot's ``Robot`` methods (see the module docstring)."""

    name = "embodyrl_sim_follower"

    def __init__(self, *, cameras: dict | None = None, substeps: int = 10, id: str = "sim"):
        self.id = id
        self.substeps = int(substeps)
        self.camera_sizes = {str(n): (int(c["width"]), int(c["height"])) for n, c in (cameras or {}).items()}
        self._data = None
        self.sent = 0

    @property
    def observation_features(self) -> dict:
        return {**dict.fromkeys(NAMES, float), **{n: (h, w, 3) for n, (w, h) in self.camera_sizes.items()}}

    @property
    def action_features(self) -> dict:
        return dict.fromkeys(NAMES, float)

    @property
    def is_connected(self) -> bool:
        return self._data is not None

    def connect(self, calibrate: bool = True) -> None:
        if self._data is not None:
            raise RuntimeError(f"{self} is already connected")
        from ..hal.drivers.mujoco import CAMERA_PREFIX, Cameras, mujoco  # picks a headless GL first

        self._mujoco, self._prefix = mujoco, CAMERA_PREFIX
        self._model = mujoco.MjModel.from_xml_path(str(ASSET))
        data = mujoco.MjData(self._model)
        data.qpos[:] = np.radians([HOME[n] for n in NAMES])
        mujoco.mj_forward(self._model, data)
        self._target = data.qpos.copy()
        self._low, self._high = self._model.actuator_ctrlrange.T
        self._cameras = Cameras(self._model, self.camera_sizes)
        self._cameras.open()
        self._data = data

    def _require(self):
        if self._data is None:
            raise RuntimeError(f"{self} is not connected")
        return self._data

    def get_observation(self) -> dict:
        data = self._require()
        observation = {n: float(np.degrees(q)) for n, q in zip(NAMES, data.qpos, strict=True)}
        for field, frame in self._cameras.render(data).items():
            observation[field.removeprefix(self._prefix)] = frame
        return observation

    def send_action(self, action: dict) -> dict:
        data = self._require()
        self._target = np.radians([float(action[n]) for n in NAMES])
        kp, kd = np.asarray(KP), np.asarray(KD)
        for _ in range(self.substeps):
            torque = kp * (self._target - data.qpos) - kd * data.qvel + data.qfrc_bias
            data.ctrl[:] = np.clip(torque, self._low, self._high)
            self._mujoco.mj_step(self._model, data)
        self.sent += 1
        return dict(action)

    def disconnect(self) -> None:
        self._require()
        self._cameras.close()
        self._data = None

    def __str__(self) -> str:
        return f"{self.id} {type(self).__name__}"


def follower(**options) -> SimulatedFollower:
    """``device: {factory: embodyrl.envs.lerobot_arm:follower, args: {...}, bounds: ...}``."""
    return SimulatedFollower(**options)


class ScriptedLeader(_Uncalibrated):
    """A person at a leader arm, with LeRobot's ``Teleoperator`` methods (see the module docstring)."""

    name = "embodyrl_scripted_leader"

    def __init__(self, *, rest_polls: int = 10, move_polls: int = 50, hold_polls: int = 40, id: str = "person"):
        self.id = id
        self.rest_polls, self.move_polls, self.hold_polls = rest_polls, move_polls, hold_polls
        self.polls = 0
        self._connected = False

    @property
    def action_features(self) -> dict:
        return dict.fromkeys(NAMES, float)

    @property
    def feedback_features(self) -> dict:
        return {}

    @property
    def is_connected(self) -> bool:
        return self._connected

    def connect(self, calibrate: bool = True) -> None:
        self._connected = True

    def get_action(self) -> dict:
        if not self._connected:
            raise RuntimeError(f"{self.id} is not connected")
        t = self.polls % (self.rest_polls + self.move_polls + self.hold_polls)
        self.polls += 1
        share = min(max(t - self.rest_polls, 0) / self.move_polls, 1.0)
        return {n: HOME[n] + share * (GOAL[n] - HOME[n]) for n in NAMES}

    def send_feedback(self, feedback: dict) -> None:
        """A leader arm without motors feels nothing."""

    def disconnect(self) -> None:
        self._connected = False


def leader(**options) -> ScriptedLeader:
    """``--teleop lerobot:embodyrl.envs.lerobot_arm.leader``."""
    return ScriptedLeader(**options)


class PoseTask(Task):
    """Reach :data:`GOAL`: the reward is minus the mean joint error in tens of degrees; success: every
    joint within :data:`SUCCESS_DEG` of its goal at the episode's end."""

    name = "lerobot_arm_pose"

    def __init__(self, max_episode_steps: int = 100):
        self.max_episode_steps = max_episode_steps
        self.goal = np.array([GOAL[n] for n in NAMES], np.float64)

    def _error(self, observation) -> np.ndarray:
        return np.abs(np.asarray(observation["state"], np.float64) - self.goal)

    def reward(self, observation, action, next_observation) -> float:
        return -float(self._error(next_observation).mean()) / 10.0

    def episode_metrics(self, observations) -> dict[str, float]:
        error = self._error(observations[-1])
        return {"final_error_deg": float(error.mean()), "success": float((error < SUCCESS_DEG).all())}


def pose_task(max_episode_steps: int = 100) -> PoseTask:
    """``task: {factory: embodyrl.envs.lerobot_arm:pose_task}``."""
    return PoseTask(max_episode_steps)
