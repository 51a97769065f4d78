"""Which extra brings which module (:mod:`embodyrl.cli.extras`), and ``main`` naming it instead of
a traceback. ``tests/test_packaging.py`` runs each command on a real base install."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

from embodyrl.cli import commands
from embodyrl.cli.extras import EXTRAS, extra_of, missing_extra
from tests.cli_helpers import in_process

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# the base install's modules: numpy, pyzmq, msgpack, ml_dtypes, PyYAML, and the package itself
BASE = {"numpy", "zmq", "msgpack", "ml_dtypes", "yaml", "embodyrl"}


def _imported_modules() -> dict[str, str]:
    """Top-level module -> a file importing it, for every absolute import in the package's sources."""
    found = {}
    for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values():
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.partition(".")[0], str(path.relative_to(ROOT)))
    return found


def test_every_module_the_package_imports_is_the_base_installs_or_an_extras():
    unknown = {module: where for module, where in _imported_modules().items()
               if module not in sys.stdlib_module_names and module not in BASE and module not in EXTRAS}
    assert unknown == {}, "add these to embodyrl/cli/extras.py EXTRAS (or to the base dependencies)"


def test_every_extra_named_is_one_of_pyprojects():
    assert set(EXTRAS.values()) - set(PYPROJECT["project"]["optional-dependencies"]) == set()


def test_the_base_dependencies_are_the_base_modules():
    """BASE above follows pyproject's dependencies: one module per requirement."""
    assert len(PYPROJECT["project"]["dependencies"]) == len(BASE - {"embodyrl"})


@pytest.mark.parametrize(("module", "extra"), [("jax", "learner"), ("jax.numpy", "learner"),
                                               ("orbax.checkpoint", "learner"), ("PIL.Image", "console"),
                                               ("mujoco", "mujoco"), ("gymnasium", "gym"), ("ray", "ray"),
                                               ("matplotlib.pyplot", "plot"), ("mpi4py", "mpi"),
                                               ("zstandard", "compress"), ("lz4.block", "compress"),
                                               ("numpy", None), ("embodyrl.nothing", None), (None, None)])
def test_extra_of(module, extra):
    assert extra_of(module) == extra


def test_missing_extra_is_one_line_naming_the_extra_and_its_pip_command():
    line = missing_extra(ModuleNotFoundError("No module named 'flax'", name="flax.nnx"), "train")
    assert line == ("embodyrl: train needs the learner extra (no module named 'flax'): "
                    "pip install 'embodyrl[learner]'")
    assert missing_extra(ModuleNotFoundError("no", name="mystery")) is None


def test_main_names_the_extra_of_a_module_missing_while_running(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as in an install where `import matplotlib` fails
    proc = in_process("plot", tmp_path, "--out", tmp_path / "curves.png")
    assert proc.returncode == 2
    assert proc.stderr == ("embodyrl: plot needs the plot extra (no module named 'matplotlib'): "
                           "pip install 'embodyrl[plot]'\n")


def test_main_names_the_extra_of_a_module_missing_while_building_the_parser(monkeypatch):
    def parser_needing_jax():
        raise ModuleNotFoundError("No module named 'jax'", name="jax")

    monkeypatch.setattr(commands, "build_parser", parser_needing_jax)
    proc = in_process("train", "--help")
    assert (proc.returncode, proc.stderr) == (2, "embodyrl needs the learner extra (no module named 'jax'): "
                                                 "pip install 'embodyrl[learner]'\n")


def test_main_lets_a_module_of_no_extra_raise(monkeypatch, tmp_path):
    """A missing module of the package itself is a broken install, not a choice: its traceback stays."""
    monkeypatch.setitem(sys.modules, "embodyrl.cli.plot", None)
    with pytest.raises(ModuleNotFoundError):
        in_process("plot", tmp_path)
