"""Which extra brings which module, so that a command names what to install instead of a traceback.

The base install (``pip install embodyrl``: numpy, pyzmq, msgpack, ml_dtypes, PyYAML) runs the
edge: the HAL, the actor, the wire. Everything else comes with an extra of ``pyproject.toml``
(``pip install 'embodyrl[learner]'``). A command imports an extra's modules where it uses them, so
the first one missing raises :class:`ModuleNotFoundError` there; :func:`embodyrl.cli.commands.main`
turns it into one line through :func:`missing_extra` and exits with 2 (bad arguments: this
install cannot run that command). A module not listed here is a bug, not an install choice, and
its error propagates with its traceback.

``tests/test_extras.py`` checks that every third-party module the package imports is either a
base dependency or listed here, and that every extra named here exists in ``pyproject.toml``.
"""

from __future__ import annotations

EXTRAS: dict[str, str] = {
    # the learner, training and anything that loads a saved network
    "jax": "learner",
    "jaxlib": "learner",
    "flax": "learner",
    "optax": "learner",
    "orbax": "learner",
    "tensorboardX": "learner",
    "rich": "learner",
    "mujoco": "mujoco",
    "gymnasium": "gym",
    "ray": "ray",
    # the operator console and the edge's camera stream (JPEG)
    "starlette": "console",
    "uvicorn": "console",
    "websockets": "console",
    "PIL": "console",
    "matplotlib": "plot",
    "mpi4py": "mpi",
    "zstandard": "compress",
    "lz4": "compress",
    "evdev": "teleop",
    "pyarrow": "dataset",  # LeRobotDataset's Parquet (hal/lerobot_dataset.py)
    "av": "dataset",  # and its MP4s
    "lerobot": "lerobot",  # LeRobot's robots and teleoperators (hal/lerobot.py); brings torch
    "draccus": "lerobot",
    "pytest": "test",  # the conformance suites shipped in embodyrl.hal.testing
    "gym_hil": "hilserl",  # gym-hil's tasks (envs/panda_pick.py); needs mujoco below 3.9
    "sbx": "compare",  # embodyrl bench crossq's baseline (optional there: without it the bench says so)
}


def extra_of(module: str | None) -> str | None:
    """The extra that installs ``module`` (dotted names by their top level), or None."""
    if not module:
        return None
    return EXTRAS.get(module.partition(".")[0])


def missing_extra(err: ModuleNotFoundError, command: str | None = None) -> str | None:
    """The line that tells which extra ``command`` lacks, for an import that failed with ``err``;
    None when the missing module is no extra's."""
    extra = extra_of(err.name)
    if extra is None:
        return None
    top = err.name.partition(".")[0]
    who = f"embodyrl: {command}" if command else "embodyrl"
    return f"{who} needs the {extra} extra (no module named {top!r}): pip install 'embodyrl[{extra}]'"
