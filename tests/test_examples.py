"""Every ``examples/*.py`` runs as it is, on a tiny budget, in its own process.

``EXAMPLES`` names each example's tiny-budget arguments. A new example is
picked up from the folder: until it has an entry here, its test fails
saying so. An example whose optional dependency is missing is skipped,
naming it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.cli_helpers import default_sigint

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_DIR = ROOT / "examples"


@dataclass(frozen=True)
class Example:
    args: tuple[str, ...] = ()
    """Tiny-budget arguments. ``{tmp}``: a fresh directory; ``{export}``: a numpy export of the
    policy that ``train_pendulum.py --quick`` trained."""
    expect: str = ""
    """A string its stdout must contain (what the example promises to print)."""
    needs: tuple[str, ...] = ()
    """Optional modules; without one of them the example is skipped, naming it."""
    server: bool = False
    """Serves until Ctrl-C: the test waits for its endpoint line, drives it, then interrupts it."""
    timeout_s: float = 600.0
    covered: str = ""
    """A test of its own runs it on its tiny budget and checks what it writes: not run twice."""


EXAMPLES: dict[str, Example] = {
    "train_pendulum.py": Example(("--quick", "--run-dir", "{tmp}/run"), expect="upright"),
    "numpy_actor.py": Example(("{export}", "--task", "pendulum", "--max-steps", "50"),
                              expect='"jax_imported": false'),
    "remote_robot_driver.py": Example(("--bind", "tcp://127.0.0.1:*"), server=True),
    "distributed_q_learning.py": Example(("--agents", "2", "--samples", "200")),
    "vrdq_sweep.py": Example(("--out", "{tmp}/vrdq", "--seeds", "1", "--samples", "300", "--per-sample-samples",
                              "30", "--per-sample-agents", "1", "5"), expect="never_worse_than_one_agent", needs=("matplotlib",)),
    "lorenz96_correction.py": Example(("--out", "{tmp}/l96", "--quick"), expect="lead", needs=("matplotlib",)),
    "nwp_column_correction.py": Example(covered="tests/test_coupling_nwp.py (--quick: every key)"),
    "distributed_dqn.py": Example(("--learners", "1", "2", "--max-steps", "400", "--epoch-steps", "200",
                                   "--epsilon-decay-steps", "200", "--out", "{tmp}/dqn.json"),
                                  expect="learner(s), seed 0", needs=("gymnasium", "matplotlib")),
    "hil_robot.py": Example(covered="tests/test_hil_robot.py (--quick: every variant, the same keys)"),
    "ee_reach.py": Example(covered="tests/test_end_effector.py (--quick: both variants, every key, the kept runs)"),
    "lerobot_dataset_training.py": Example(("--out", "{tmp}/lrd", "--quick"), expect='"dataset"',
                                           needs=("lerobot", "matplotlib")),
    "heterogeneous_robots.py": Example(("--steps", "600", "--episodes", "1", "--run-dir", "{tmp}/hetero")),
    "compare_sbx.py": Example(covered="tests/test_compare_script.py (every embodyrl command parsed and validated, "
                                      "the report on runs' summaries); the runs themselves take hours"),
    "hilserl_side_by_side.py": Example(covered="tests/test_hilserl.py (its parts here; --quick beside "
                                               "hilserl_faults.py where EMBODYRL_HILSERL_VENV names the "
                                               "experiment's environment: torch, LeRobot, gym-hil)"),
    "hilserl_faults.py": Example(covered="tests/test_hilserl.py (--quick, in the experiment's environment)"),
    "hilserl_lerobot_actor.py": Example(covered="tests/test_hilserl.py (LeRobot's actor, started by "
                                                "hilserl_side_by_side.py --quick in the experiment's environment)"),
    "ppo_staleness.py": Example(("--seeds", "0", "--staleness", "0", "--steps", "2000", "--root", "{tmp}/ppo",
                                 "--out", "{tmp}/ppo.json"), expect="k=0 seed=0", needs=("matplotlib",)),
}

_done: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}


def _missing(example: Example) -> str | None:
    for module in example.needs:
        if importlib.util.find_spec(module) is None:
            return f"needs {module}, not installed"
    return None


def _run(name: str, tmp: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Run example ``name`` once per session (``{export}`` asks for train_pendulum's run first)."""
    if name in _done:
        return _done[name]
    example = EXAMPLES[name]
    tmp.mkdir(parents=True, exist_ok=True)
    args = [a.replace("{tmp}", str(tmp)) for a in example.args]
    if "{export}" in args:
        args[args.index("{export}")] = str(_export(tmp))
    proc = subprocess.Popen([sys.executable, str(EXAMPLE_DIR / name), *args], cwd=tmp, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=example.timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    _done[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, out, err), tmp)
    return _done[name]


def _export(tmp: Path) -> Path:
    from embodyrl.cli.export import export_saved_policy

    _, train_tmp = _run("train_pendulum.py", tmp.parent / "train_pendulum")
    json_path, _ = export_saved_policy(train_tmp / "run" / "policy", tmp / "export" / "policy")
    return json_path


def _serve_and_drive(name: str, example: Example, tmp: Path) -> None:
    """Start a serving example, step a RemoteDevice against it, then Ctrl-C it: exit 0."""
    from embodyrl.hal.drivers.remote import RemoteDevice

    proc = subprocess.Popen([sys.executable, str(EXAMPLE_DIR / name), *example.args], cwd=tmp, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_sigint)
    try:
        line = proc.stdout.readline()
        found = re.search(r"tcp://\S+", line)
        assert found, (line, proc.communicate(timeout=10)[1] if proc.poll() is not None else "")
        with RemoteDevice(found.group(0).rstrip(";,"), timeout_s=2.0) as device:
            device.reset(seed=0)
            observation = device.step(np.zeros(device.action_spec.shape, device.action_spec.dtype))
            assert all(np.isfinite(v).all() for v in observation.values())
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLE_DIR.glob("*.py")))
def test_example_runs_on_a_tiny_budget(name, tmp_path_factory):
    if name not in EXAMPLES:
        pytest.fail(f"examples/{name} has no entry in EXAMPLES (tests/test_examples.py): "
                    "add its tiny-budget arguments there")
    example = EXAMPLES[name]
    if example.covered:
        pytest.skip(f"examples/{name} runs in {example.covered}")
    missing = _missing(example)
    if missing:
        pytest.skip(f"examples/{name} {missing}")
    tmp = tmp_path_factory.getbasetemp() / "examples" / name.removesuffix(".py")
    tmp.mkdir(parents=True, exist_ok=True)
    if example.server:
        _serve_and_drive(name, example, tmp)
        return
    done, _ = _run(name, tmp)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert example.expect in done.stdout, done.stdout[-2000:]


def test_every_entry_names_an_example():
    stale = sorted(set(EXAMPLES) - {p.name for p in EXAMPLE_DIR.glob("*.py")})
    assert not stale, f"EXAMPLES names examples that do not exist: {stale}"


@pytest.mark.parametrize("name", sorted(p.name for p in (EXAMPLE_DIR / "configs").glob("*.yaml")))
def test_every_example_config_builds_a_train_config_for_its_task(name):
    from embodyrl.config import TrainConfig, _merge, default_config, from_dict, load_yaml, to_dict
    from embodyrl.envs import is_known

    changes = load_yaml(EXAMPLE_DIR / "configs" / name)
    assert is_known(changes["task"]), changes["task"]
    merged = to_dict(default_config(changes["task"]))
    _merge(merged, changes)
    config = from_dict(TrainConfig, merged)
    assert config.task == changes["task"]
    assert to_dict(config)["learner"]["updates_per_step"] == changes["learner"]["updates_per_step"]
