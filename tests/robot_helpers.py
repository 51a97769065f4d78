"""Factories and a scripted teleop source that robot tests name as ``robot_helpers:NAME``
(tests/ on PYTHONPATH, or copied beside the command)."""

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
