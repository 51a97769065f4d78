"""What every test shares: one JAX compilation cache for the test processes and every process they start.

Most of the suite's time went to processes (``embodyrl train``, ``learner``, ``actor``, the
examples) that each compile the same small updates again. JAX's persistent cache, set through
the environment before anything imports JAX, keeps each compiled program once per machine:
the first process to compile a program writes it, every later one (in this run or the next)
reads it. ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`` keeps the small compiles too, which
are most of them here. A test that sets its own environment for a child starts from
``os.environ`` and so inherits the cache.

The cache lives in the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``, then
``embodyrl/jax-tests``), not in the checkout: a fresh clone's first run (CI's) then starts from
what earlier runs on the machine compiled, as a developer's second run does. An entry is keyed by
the program, the compile options and the JAX version, so a changed program is compiled anew.
Before a run, the oldest entries beyond ``CACHE_MAX_BYTES`` are deleted (JAX's own bound keeps
per-entry access files that its processes race on when they share a directory).
``JAX_COMPILATION_CACHE_DIR``, when set, names another directory (an empty one: a cold run).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CACHE_MAX_BYTES = 1 << 30
CACHE_SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}


def user_cache() -> Path:
    """The cache directory in the user's cache home (see the module's docstring)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "embodyrl" / "jax-tests"


def prune(cache: Path, max_bytes: int) -> None:
    """Delete the least recently written entries until the directory holds at most ``max_bytes``."""
    entries = sorted((stat.st_mtime, stat.st_size, path) for path in cache.iterdir()
                     if path.is_file() and (stat := path.stat()))
    total = sum(size for _, size, _ in entries)
    for _, size, path in entries:
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size


def pytest_configure(config):
    cache = Path(os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(user_cache())))
    cache.mkdir(parents=True, exist_ok=True)
    if not hasattr(config, "workerinput"):  # the controller, once, before any worker starts
        prune(cache, CACHE_MAX_BYTES)
    for name, value in CACHE_SETTINGS.items():
        os.environ.setdefault(name, value)
    config._embodyrl_started = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    started = getattr(config, "_embodyrl_started", None)
    if started is not None and not hasattr(config, "workerinput"):  # the controller, not an xdist worker
        workers = getattr(config.option, "numprocesses", None) or 1
        terminalreporter.write_line(f"suite wall time: {time.monotonic() - started:.0f} s "
                                    f"({workers} worker process{'es' if workers != 1 else ''})")
