"""The edge imports only the edge: ``hal/`` (installed as ``embodyrl.hal``) needs nothing of the cloud.

A robot PC installs the base package (numpy, pyzmq, msgpack, ml_dtypes, PyYAML) and runs the
edge: no JAX, no MuJoCo, nothing of ``embodyrl`` outside ``embodyrl.hal``. Two checks: every
import statement under ``hal/``, read with ``ast`` (relative ones resolved against the module's
installed package); and every module under ``hal/`` really imported, with JAX, Flax, Optax and
MuJoCo made unimportable, looking at what else of ``embodyrl`` came in.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HAL = ROOT / "hal"
PACKAGE = "embodyrl.hal"

BASE = {"numpy", "zmq", "msgpack", "ml_dtypes", "yaml"}
"""The base install's third-party packages (pyproject's ``dependencies``)."""

LAZY = {
    ("console.py", "PIL"): "JPEG frames for the console's camera stream (the console extra)",
    ("teleop.py", "evdev"): "gamepads and spacemice (the teleop extra)",
    ("lerobot_dataset.py", "pyarrow"): "LeRobotDataset's Parquet files (the dataset extra)",
    ("lerobot_dataset.py", "av"): "LeRobotDataset's MP4s (the dataset extra)",
    ("lerobot.py", "lerobot"): "LeRobot's robots and teleoperators by type (the lerobot extra)",
    ("lerobot.py", "draccus"): "LeRobot's config classes, decoded as LeRobot decodes them (the lerobot extra)",
    ("wire/compression.py", "zstandard"): "zstd frames (the compress extra)",
    ("wire/compression.py", "lz4"): "lz4 frames (the compress extra)",
}
"""Optional dependencies a hal module may import, only inside the function that needs them."""

MODULE_LEVEL = {
    ("drivers/mujoco.py", "mujoco"): "the MuJoCo driver is MuJoCo (the mujoco extra)",
    ("kinematics.py", "mujoco"): "an arm's kinematics from its MJCF or URDF, computed by MuJoCo (the mujoco extra)",
    ("drivers/gymnasium.py", "gymnasium"): "drives a Gymnasium env (the gym extra)",
    ("gym_env.py", "gymnasium"): "a device and task as a Gymnasium env (the gym extra)",
    ("testing.py", "pytest"): "the device conformance suite, which pytest runs",
}
"""Modules that are an optional feature, and the dependency they import at their top."""

BLOCKED = ("jax", "flax", "optax", "mujoco")
NOT_IMPORTED_WITH_BLOCKED = {
    "embodyrl.hal.drivers.mujoco": "the MuJoCo driver imports MuJoCo at its top",
    "embodyrl.hal.kinematics": "the arm's kinematics are MuJoCo's (end_effector.py imports it only to build a device)",
}
"""Modules that cannot be imported while MuJoCo is blocked, and why."""


def hal_modules() -> dict[str, Path]:
    """Installed module name -> file, for every module under ``hal/``."""
    found = {}
    for path in sorted(HAL.rglob("*.py")):
        parts = path.relative_to(HAL).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((PACKAGE, *parts))] = path
    return found


def _module_level(tree: ast.Module) -> set[int]:
    """ids of the import nodes not inside a function (run when the module is imported)."""
    top: set[int] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                top.add(id(child))
            visit(child)

    visit(tree)
    return top


def imports(name: str, path: Path) -> list[tuple[int, str, bool]]:
    """(line, absolute module imported, whether at module level) of each import in one module."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = _module_level(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    raise AssertionError(f"{path}:{node.lineno}: relative import above the top package")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module
            if module == PACKAGE or PACKAGE.startswith(module + "."):
                # ``from .. import x`` at or above embodyrl.hal: each name may be a module of its own
                found += [(node.lineno, f"{module}.{alias.name}", id(node) in top) for alias in node.names]
            else:
                found.append((node.lineno, module, id(node) in top))
    return found


def within_hal(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def test_hal_modules_import_only_the_edge():
    """Every import under hal/ is hal's own, the standard library's, a base dependency's, or an
    optional feature's listed above (lazily where it says so): never the rest of embodyrl."""
    problems, used = [], set()
    for name, path in hal_modules().items():
        rel = path.relative_to(HAL).as_posix()
        for line, module, at_top in imports(name, path):
            where = f"hal/{rel}:{line}: imports {module}"
            top = module.partition(".")[0]
            if within_hal(module) or top in sys.stdlib_module_names or top in BASE:
                continue
            if top == "embodyrl":
                problems.append(f"{where}, which is outside {PACKAGE}")
            elif (rel, top) in MODULE_LEVEL:
                used.add((rel, top))
            elif (rel, top) in LAZY:
                used.add((rel, top))
                if at_top:
                    problems.append(f"{where} at module level: an optional dependency, import it inside "
                                    "the function that needs it")
            else:
                problems.append(f"{where}, not a base dependency of the edge (numpy, pyzmq, msgpack, "
                                "ml_dtypes, PyYAML)")
    stale = (set(LAZY) | set(MODULE_LEVEL)) - used
    problems += [f"hal/{rel}: listed as importing {top}, which it no longer does" for rel, top in sorted(stale)]
    assert not problems, "\n".join(problems)


def test_relative_imports_resolve_against_the_installed_package(tmp_path):
    """hal/ is installed as embodyrl.hal: ``..`` from hal/x.py is embodyrl, from hal/wire/x.py embodyrl.hal."""
    (tmp_path / "x.py").write_text("from ..cli import security\nfrom ... import robot\nfrom .codec import Limits\n")
    found = imports("embodyrl.hal.wire.x", tmp_path / "x.py")
    assert [module for _, module, _ in found] == ["embodyrl.hal.cli", "embodyrl.robot", "embodyrl.hal.wire.codec"]
    (tmp_path / "y.py").write_text("from ..cli import security\nfrom .. import envs, hal\nfrom . import steps\n")
    found = imports("embodyrl.hal.y", tmp_path / "y.py")
    assert [module for _, module, _ in found] == ["embodyrl.cli", "embodyrl.envs", "embodyrl.hal",
                                                  "embodyrl.hal.steps"]
    (tmp_path / "__init__.py").write_text("from .codec import Limits\n")
    assert imports("embodyrl.hal.wire", tmp_path / "__init__.py")[0][1] == "embodyrl.hal.wire.codec"


IMPORT_ALL = """
import importlib, json, sys
for name in {blocked!r}:
    sys.modules[name] = None  # importing it raises ImportError
failed = {{}}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception as err:
        failed[name] = f"{{type(err).__name__}}: {{err}}"
print(json.dumps({{"failed": failed, "modules": sorted(sys.modules),
                  "real": sorted(m for m, v in sys.modules.items() if v is not None)}}))
"""


def test_every_hal_module_imports_without_jax_or_mujoco():
    """Every module under hal/, and embodyrl.robot (a robot file's reader, used at the edge), imports
    with JAX, Flax, Optax and MuJoCo unimportable, and brings in nothing of embodyrl but the edge."""
    names = []
    for name, path in hal_modules().items():
        rel = path.relative_to(HAL).as_posix()
        if name in NOT_IMPORTED_WITH_BLOCKED:
            continue
        missing = [top for (file, top) in MODULE_LEVEL if file == rel and importlib.util.find_spec(top) is None]
        if not missing:  # a feature module whose extra is not installed here is not importable anyway
            names.append(name)
    assert len(names) > 30, names
    names.append("embodyrl.robot")
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL.format(blocked=BLOCKED), json.dumps(names)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["failed"], "\n".join(f"{name}: {err}" for name, err in result["failed"].items())
    allowed = (PACKAGE, "embodyrl.envs", "embodyrl.robot")
    outside = [m for m in result["modules"] if m.partition(".")[0] == "embodyrl" and m != "embodyrl"
               and not any(m == a or m.startswith(a + ".") for a in allowed)]
    assert not outside, f"importing the edge pulled in {outside}"
    heavy = [m for m in result["real"] if m.partition(".")[0] in {*BLOCKED, "torch", "starlette", "uvicorn"}]
    assert not heavy, f"importing the edge pulled in {heavy}"


def test_the_robot_server_starts_without_a_runpy_warning():
    """``python -m embodyrl.hal.robot_server`` runs a module the package did not import first."""
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "embodyrl.hal.robot_server", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "RuntimeWarning" not in out.stderr, out.stderr
