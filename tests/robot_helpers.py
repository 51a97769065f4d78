"""Factories and a scripted teleop source that robot tests name as ``robot_helpers:NAME``
(tests/ on PYTHONPATH, or copied beside the command)."""

import shutil
import subprocess
import sys

import numpy as np


def pendulum():
    """A ``module:factory`` robot: ``(device, task)``, as ``envs.make`` returns."""
    from embodyrl import envs

    return envs.make("pendulum")


def reach_task(steps: int = 250):
    """A task factory for a robot file's ``task.factory``: the arm's own reaching task."""
    from embodyrl.envs.arm import ArmConfig, Reach

    return Reach(ArmConfig(max_episode_steps=steps), torque_limits=np.full(7, 80.0))


def not_a_pair():
    return "device"


def hold(observation, step):
    """A scripted teleop source for the 7-joint arm: no torque, every step."""
    return np.zeros(7, np.float32)


def point_mass():
    """A numpy-only ``module:factory`` robot (no MuJoCo): a point on a plane pushed toward the origin.
    What a robot PC with the base install can run."""
    return point_mass_device(), point_mass_task()


def point_mass_device():
    """The point mass alone: what a robot server serves (``robot_helpers:point_mass_device``)."""
    from embodyrl.hal.device import Device
    from embodyrl.hal.specs import ArraySpec, DictSpec

    class PointMass(Device):
        observation_spec = DictSpec.of(ArraySpec("position", (2,), np.float32),
                                       ArraySpec("velocity", (2,), np.float32))
        action_spec = ArraySpec("force", (2,), np.float32, -1.0, 1.0)
        control_period_s = 0.02
        safe_action = np.zeros(2, np.float32)

        def _reset(self, seed):
            rng = np.random.default_rng(seed)
            self.x, self.v = rng.uniform(-1, 1, 2).astype(np.float32), np.zeros(2, np.float32)
            return self._observe()

        def _step(self, action):
            self.v = (0.9 * self.v + 0.1 * action).astype(np.float32)
            self.x = np.clip(self.x + self.v, -2, 2).astype(np.float32)
            return self._observe()

        def _observe(self):
            return {"position": self.x.copy(), "velocity": self.v.copy()}

    return PointMass()


def point_mass_task():
    """Reach the origin, in 50-step episodes (a robot file's ``task.factory``)."""
    from embodyrl.hal.task import Task

    class Reach(Task):
        name = "reach"
        max_episode_steps = 50

        def reward(self, observation, action, next_observation):
            return -float(np.linalg.norm(next_observation["position"]))

    return Reach()


def point_mass_off_its_spec():
    """The point mass with a driver fault: after the first step its position comes back as float64."""
    device, task = point_mass()
    step = device._step

    def off_spec(action):
        observation = step(action)
        observation["position"] = observation["position"].astype(np.float64)
        return observation

    device._step = off_spec
    return device, task


class Alternating:
    """A policy proposing +2, -2, +2, ... (a jump of 4 N m each step on the pendulum); it acts without weights."""

    def __init__(self):
        from embodyrl.hal.steps import NO_POLICY

        self.version, self.sign = NO_POLICY, 1.0

    def act(self, observation, *, explore):
        self.sign = -self.sign
        return np.array([2.0 * self.sign], np.float32), {}

    def load_weights(self, version, arrays):
        raise AssertionError("no weights in this test")


def served_with_keys(directory, source: str, *options: str, env=None):
    """``python -m embodyrl.hal.robot_server SOURCE`` (``embodyrl robot-server`` for a robot file) on loopback with CurveZMQ keys made in
    ``directory/keys`` (the actor's authorised): (the server process, its endpoint). A robot PC's
    server, so a test drives the real process boundary; terminate it when done."""
    from embodyrl.hal.wire.security import generate_keys

    generate_keys(directory / "keys" / "robot", "robot")
    public, _ = generate_keys(directory / "keys" / "actor", "actor")
    (directory / "keys" / "authorized").mkdir()
    shutil.copy(public, directory / "keys" / "authorized")
    command = ["embodyrl.cli", "robot-server"] if source.endswith(".yaml") else ["embodyrl.hal.robot_server"]
    server = subprocess.Popen(
        [sys.executable, "-m", *command, source, "--bind", "tcp://127.0.0.1:*",
         "--watchdog-s", "60", "--secret-key", "keys/robot/robot.key_secret", "--authorized-keys",
         "keys/authorized", *options], cwd=directory, stdout=subprocess.PIPE, text=True, env=env)
    line = server.stdout.readline()
    assert line.startswith("robot server on tcp://"), line
    return server, line.split()[-1]
