"""Tasks: MuJoCo models and their rewards, built on the HAL.

``make(name)`` returns a ``(device, task)`` pair for a task name:

* a registered task (``names()``: pendulum, arm_reach, arm_reach_ee (the same reach in end-effector
  moves), arm_push, pendulum_pixels,
  pendulum_pixels_stacked, halfcheetah);
* ``gym:ID``, any Gymnasium id with a ``Box`` action space, driven through
  :mod:`embodyrl.hal.drivers.gymnasium` (``gym:Pendulum-v1``,
  ``gym:HalfCheetah-v5``; ``gym:MODULE:ID`` imports the module that registers
  the id first, as ``gymnasium.make`` does).

Tasks joined by ``+`` (``pendulum+arm_reach``) name a run over devices of
different shapes, one policy with per-device heads; ``parts(name)`` splits
them, ``make`` builds one part at a time, and ``layout(name)`` declares the
run's device kinds (:class:`embodyrl.hal.layout.Layout`: one kind for a plain
task, one per part otherwise). This parsing is the only place that knows ``+``.
``reward_bound(name)`` is the largest |reward| a task pays (its module's
``REWARD_BOUND``; the learner refuses a row beyond it).

The other direction: ``register_gymnasium()`` registers each task with
Gymnasium as ``embodyrl/<Name>-v0`` (``GYMNASIUM_IDS``), so that
``gymnasium.make("embodyrl/Pendulum-v0")`` works. It is called on import of
this package when Gymnasium is already imported, so
``gymnasium.make("embodyrl.envs:embodyrl/Pendulum-v0")`` works with no set-up.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module

# name -> "module:factory"; modules are imported on demand so that listing
# tasks does not import MuJoCo.
_REGISTRY: dict[str, str] = {
    "pendulum": "embodyrl.envs.pendulum:make",
    "arm_reach": "embodyrl.envs.arm:make",
    "arm_reach_ee": "embodyrl.envs.arm:make_ee",
    "arm_push": "embodyrl.envs.arm_push:make",
    "pendulum_pixels": "embodyrl.envs.pixels:make",
    "pendulum_pixels_stacked": "embodyrl.envs.pixels:make_stacked",
    "halfcheetah": "embodyrl.envs.gym_tasks:make_halfcheetah",
}

GYM_PREFIX = "gym:"
"""Task names starting with this are Gymnasium ids: ``gym:Pendulum-v1``."""

GYMNASIUM_IDS: dict[str, tuple[str, int]] = {
    "pendulum": ("embodyrl/Pendulum-v0", 200),
    "arm_reach": ("embodyrl/ArmReach-v0", 250),
    "arm_reach_ee": ("embodyrl/ArmReachEE-v0", 250),
    "arm_push": ("embodyrl/ArmPush-v0", 50),
    "pendulum_pixels": ("embodyrl/PendulumPixels-v0", 200),
    "pendulum_pixels_stacked": ("embodyrl/PendulumPixelsStacked-v0", 200),
}
"""Task name -> (Gymnasium id, the task's max_episode_steps, written out so registering imports no MuJoCo).

Tasks that are Gymnasium envs already (halfcheetah) are not registered again."""


def names() -> list[str]:
    """The registered task names (``gym:ID`` names are accepted too, but not listed)."""
    return sorted(_REGISTRY)


SEPARATOR = "+"
"""Joins the tasks of a heterogeneous run: ``pendulum+arm_reach`` (device ids 0 and 1)."""


def parts(name: str) -> tuple[str, ...]:
    """The tasks of ``name``, in device-id order (one for a plain task)."""
    return tuple(name.split(SEPARATOR))


def is_known(name: str) -> bool:
    """Whether ``name`` is a registered task, ``gym:`` plus a registered id, or distinct known tasks joined by ``+``."""
    if SEPARATOR in name:
        tasks = parts(name)
        return len(set(tasks)) == len(tasks) and all(SEPARATOR not in t and is_known(t) for t in tasks)
    if name in _REGISTRY:
        return True
    if not name.startswith(GYM_PREFIX) or len(name) == len(GYM_PREFIX):
        return False
    try:
        import gymnasium
    except ImportError:
        return False
    register_gymnasium()
    module, _, env_id = name[len(GYM_PREFIX):].rpartition(":")
    if module:  # Gymnasium's "module:id": the module registers the id on import
        try:
            import_module(module)
        except ImportError:
            return False
    return env_id in gymnasium.registry


def unknown_reason(name: str) -> str:
    """Why ``name`` is not a task, naming what is: for error messages."""
    if SEPARATOR in name:
        tasks = parts(name)
        if not all(tasks):
            return f"task {name!r}: a part between the {SEPARATOR} signs is empty"
        if len(set(tasks)) != len(tasks):
            return f"task {name!r} names a device twice (more copies of one device: more actors)"
        return next(unknown_reason(t) for t in tasks if not is_known(t))
    if name.startswith(GYM_PREFIX):
        try:
            import gymnasium  # noqa: F401
        except ImportError:
            return f"task {name!r} needs gymnasium (pip install 'embodyrl[gym]')"
        return f"unknown Gymnasium id {name[len(GYM_PREFIX):]!r} in task {name!r}"
    return (f"unknown task {name!r}; known: {', '.join(names())}, or gym:ID for a Gymnasium id "
            f"(e.g. gym:Pendulum-v1)")


def factory(name: str) -> Callable:
    if SEPARATOR in name:
        raise KeyError(f"task {name!r} is several devices; build each of envs.parts(name)")
    if name.startswith(GYM_PREFIX):
        from ..hal.drivers import gymnasium as gym_driver

        env_id = name[len(GYM_PREFIX):]
        return lambda **kwargs: gym_driver.make(env_id, **kwargs)
    if name not in _REGISTRY:
        raise KeyError(unknown_reason(name))
    module, attr = _REGISTRY[name].split(":")
    return getattr(import_module(module), attr)


def reward_bound(name: str) -> float:
    """The largest |reward| task ``name`` (one part) declares: its module's ``REWARD_BOUND``, else
    :data:`embodyrl.hal.steps.REWARD_BOUND` (a Gymnasium id's rewards are its own). Builds nothing."""
    from ..hal.steps import REWARD_BOUND

    if name in _REGISTRY:
        return float(getattr(import_module(_REGISTRY[name].split(":")[0]), "REWARD_BOUND", REWARD_BOUND))
    return REWARD_BOUND


def make(name: str, **kwargs):
    """Build the (device, task) pair for ``name`` (a registered task, or ``gym:ID``)."""
    return factory(name)(**kwargs)


def layout(name: str):
    """The :class:`~embodyrl.hal.layout.Layout` of task ``name``: one device kind per part, in
    device-id order, each with the specs of the device its task builds."""
    from ..hal.layout import DeviceKind, Layout

    kinds = []
    for part in parts(name):
        device, _ = make(part)
        kinds.append(DeviceKind(part, device.observation_spec, device.action_spec))
    return Layout(tuple(kinds))


def member_name(task: str) -> str:
    """A task's name as a device group member's ('/' separates member and field names)."""
    return task.replace("/", "-")


def make_gymnasium_env(task: str, render_mode: str | None = None, **kwargs):
    """Task ``task`` as a ``gymnasium.Env`` (the entry point of the ``embodyrl/...`` ids)."""
    from ..hal.gym_env import DeviceEnv

    device, task_object = make(task, **kwargs)
    return DeviceEnv(device, task_object, render_mode=render_mode)


def register_gymnasium() -> list[str]:
    """Register every task with Gymnasium (idempotent); returns the ids."""
    import gymnasium

    for task, (env_id, max_steps) in GYMNASIUM_IDS.items():
        if env_id not in gymnasium.registry:  # the time limit on the spec: GymTask reads it from there
            gymnasium.register(env_id, entry_point=make_gymnasium_env, kwargs={"task": task},
                               max_episode_steps=max_steps)
    return [env_id for env_id, _ in GYMNASIUM_IDS.values()]


if "gymnasium" in sys.modules:  # imported by gymnasium.make("embodyrl.envs:embodyrl/...")
    register_gymnasium()
