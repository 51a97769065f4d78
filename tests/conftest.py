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

The installed package as a user gets it: the fixture ``built_wheel`` (this checkout's wheel) and
``base_install`` (a fresh venv with that wheel and the base dependencies, no extras), both made
offline from the wheelhouse that ``.ci/setup all,test`` fills, once per test process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


# -- the installed package, as a user gets it ------------------------------------------------------

WHEELHOUSE_HINT = "run `bash .ci/setup all,test`: it downloads them there"


def wheelhouse() -> Path:
    """Where ``.ci/setup`` (with the test extra) keeps the wheels of the base dependencies and of the
    build's requirements, so that building and installing the wheel needs no network."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "embodyrl" / "wheelhouse"


def _offline_pip_env() -> dict:
    """pip without this machine's configuration (indexes, find-links, constraints): the wheelhouse alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args, "--no-index", "--find-links", str(wheelhouse())]
    done = subprocess.run(command, capture_output=True, text=True, env=_offline_pip_env(), timeout=300)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed (a wheel the wheelhouse lacks? {WHEELHOUSE_HINT}):\n"
                    f"{done.stderr[-3000:]}", pytrace=False)


def _check_wheelhouse(pyproject: dict) -> None:
    """Fail, naming the fix, when the wheelhouse lacks a wheel of a base or build requirement."""
    def name(text: str) -> str:
        return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", text)[0]).lower()

    needed = {name(r) for r in pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]}
    held = {name(w.name.split("-")[0]) for w in wheelhouse().glob("*.whl")}
    if needed - held:
        pytest.fail(f"the wheelhouse {wheelhouse()} lacks wheels of {', '.join(sorted(needed - held))}; "
                    f"{WHEELHOUSE_HINT}", pytrace=False)


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    """This checkout's wheel, built as ``pip wheel .`` builds it, from a copy of the sources (the build
    writes build/ and *.egg-info beside them, and stale files there would reach the wheel) and offline
    (setuptools from the wheelhouse)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    _check_wheelhouse(pyproject)
    source = tmp_path_factory.mktemp("source")
    for file in ("pyproject.toml", pyproject["project"]["readme"]):
        shutil.copy(ROOT / file, source / file)
    for folder in set(pyproject["tool"]["setuptools"]["package-dir"].values()):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    _pip("wheel", "-q", "--no-deps", str(source), "-w", str(out))
    (wheel,) = out.glob("embodyrl-*.whl")
    return wheel


@dataclass(frozen=True)
class BaseInstall:
    """A fresh venv holding the wheel and the base dependencies alone: ``pip install embodyrl``, no extras.

    ``run("actor", ...)`` runs its ``embodyrl`` script; ``python`` is the venv's interpreter for
    anything else (``[base_install.python, "-c", CODE]``). Both start in a temporary directory with
    no PYTHON* variables, so nothing from this checkout can be imported in place of the package."""

    python: Path
    embodyrl: Path
    cwd: Path

    def env(self) -> dict:
        return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}

    def run(self, *args, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """``embodyrl ARGS...`` of this install to completion, output captured."""
        return subprocess.run([str(self.embodyrl), *map(str, args)], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, cwd=cwd or self.cwd, env=self.env(), timeout=timeout)


@pytest.fixture(scope="session")
def base_install(built_wheel, tmp_path_factory) -> BaseInstall:
    """:class:`BaseInstall`, made once per test process (see the fixture ``built_wheel``)."""
    venv = tmp_path_factory.mktemp("base-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    _pip("--python", str(python), "install", "-q", str(built_wheel))
    return BaseInstall(python=python, embodyrl=venv / "bin" / "embodyrl", cwd=tmp_path_factory.mktemp("base-cwd"))


@pytest.fixture
def served():
    """``served(server, serve)``: ``serve(stop)`` runs on a thread of this process until the test ends;
    then ``server`` is closed."""
    running = []

    def start(server, serve):
        stop = threading.Event()
        thread = threading.Thread(target=serve, args=(stop,), daemon=True)
        thread.start()
        running.append((server, stop, thread))
        return server

    yield start
    for server, stop, thread in running:
        stop.set()
        thread.join(5)
        server.close()
