"""embodyrl.hal: the edge. Devices, specs, the step record, the wire, the actor loop.

Needs only numpy, pyzmq, msgpack and ml_dtypes; drivers import their own
library (mujoco, gymnasium, mpi4py) only when used. Never imports JAX.
"""

from .device import Device, EStopError, Health
from .specs import ArraySpec, DictSpec, SpecError, bounded
from .steps import NO_POLICY, PolicyVersion, Source, StepRecorder, Steps
from .task import Task

__all__ = [
    "NO_POLICY",
    "ArraySpec",
    "Device",
    "DictSpec",
    "EStopError",
    "Health",
    "PolicyVersion",
    "Source",
    "SpecError",
    "StepRecorder",
    "Steps",
    "Task",
    "bounded",
]
