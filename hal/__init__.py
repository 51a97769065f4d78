"""embodyrl.hal: the edge. Devices, specs, the step record, safety, the wire, the actor loop.

Needs only numpy, pyzmq, msgpack and ml_dtypes; drivers import their own
library (mujoco, gymnasium, mpi4py) only when used. Never imports JAX.
"""

from .actor import ActorConfig, ActorLoop, ActorStats
from .clock import RateClock
from .coupling import CouplingConfig, CouplingError, CouplingLink, level_inputs
from .demos import DemoWriter, load_demonstrations, send_demonstrations
from .device import Device, EpisodeInterrupted, EStopError, Health
from .drivers.remote import RemoteDevice
from .group import DeviceGroup
from .intervention import HeldCommand, InterventionSource, KeyboardTeleop, ScriptedIntervention
from .ledger import BatchLedger
from .policy import Policy, UniformRandomPolicy
from .rewards import LearnedReward, RewardTask, Shaped, Success, Term
from .runtime import NumpyPolicy
from .safety import BoxLimit, SafeDevice, SafetyConfig
from .specs import ArraySpec, DictSpec, SpecError, bounded
from .steps import NO_POLICY, PolicyVersion, Source, StepRecorder, Steps, rows_digest
from .task import Task
from .wire.client import LearnerLink, LinkError
from .wire.spool import Spool, SpoolFull

__all__ = [
    "NO_POLICY", "ActorConfig", "ActorLoop", "ActorStats", "ArraySpec", "BatchLedger", "BoxLimit", "CouplingConfig",
    "CouplingError", "CouplingLink", "DemoWriter", "Device",
    "DeviceGroup", "DictSpec", "EpisodeInterrupted", "EStopError", "Health", "HeldCommand", "InterventionSource", "KeyboardTeleop",
    "LearnedReward", "LearnerLink", "LinkError", "NumpyPolicy", "Policy", "PolicyVersion", "RateClock",
    "RemoteDevice", "RewardTask", "RobotDriver", "RobotServer", "SafeDevice", "SafetyConfig",
    "ScriptedIntervention", "Shaped", "Source", "SpecError", "Spool", "SpoolFull", "StepRecorder", "Steps",
    "Success", "Task", "Term", "UniformRandomPolicy", "bounded", "level_inputs", "load_demonstrations",
    "rows_digest", "send_demonstrations",
]


def __getattr__(name: str):
    """The robot server's classes, imported on first use: ``python -m embodyrl.hal.robot_server`` then
    runs a module the package has not imported yet (runpy warns otherwise, on every start)."""
    if name in ("RobotDriver", "RobotServer"):
        from . import robot_server

        return getattr(robot_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
