"""Tasks: MuJoCo models and their rewards, built on the HAL.

``make(name)`` returns a ``(device, task)`` pair for a registered task.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

# name -> "module:factory"; modules are imported on demand so that listing
# tasks does not import MuJoCo.
_REGISTRY: dict[str, str] = {
    "pendulum": "embodyrl.envs.pendulum:make",
    "arm_reach": "embodyrl.envs.arm:make",
    "pendulum_pixels": "embodyrl.envs.pixels:make",
    "halfcheetah": "embodyrl.envs.gym_tasks:make_halfcheetah",
}


def names() -> list[str]:
    return sorted(_REGISTRY)


def factory(name: str) -> Callable:
    if name not in _REGISTRY:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(names())}")
    module, attr = _REGISTRY[name].split(":")
    return getattr(import_module(module), attr)


def make(name: str, **kwargs):
    """Build the (device, task) pair registered as ``name``."""
    return factory(name)(**kwargs)
