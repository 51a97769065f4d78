import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_edge_import_does_not_pull_in_jax_or_mujoco():
    """Nor the console's web server or image library: the edge's console link imports Pillow only
    when it streams a camera."""
    code = ("import sys, embodyrl.hal, embodyrl.hal.actor, embodyrl.hal.console, embodyrl.hal.wire.client, "
            "embodyrl.envs; bad = [m for m in ('jax', 'flax', 'optax', 'mujoco', 'starlette', 'uvicorn', 'PIL') "
            "if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"importing the edge pulled in: {out.stdout} {out.stderr}"


def test_hal_code_imports_nothing_outside_hal():
    for path in (ROOT / "hal").rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            for banned in ("jax", "flax", "optax", "embodyrl.algos", "embodyrl.replay", "..algos"):
                assert not stripped.startswith((f"import {banned}", f"from {banned}")), f"{path}: {line}"


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = config["package-dir"]
    found = set()
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found == listed


def test_installed_package_is_this_checkout():
    import embodyrl
    import embodyrl.envs
    import embodyrl.hal

    assert Path(embodyrl.__file__).resolve().parent == ROOT / "embodyrl"
    assert Path(embodyrl.hal.__file__).resolve().parent == ROOT / "hal"
    assert Path(embodyrl.envs.__file__).resolve().parent == ROOT / "envs"
