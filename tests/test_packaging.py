"""The package as it installs: the wheel holds every module and data file, and on the base install
(no extras) every command's ``--help`` works and every command that needs an extra names it.

The wheel is built and installed offline into a fresh venv once per test process (the fixtures
``built_wheel`` and ``base_install`` of ``tests/conftest.py``; ``.ci/setup all,test`` fills the
wheelhouse they install from).
"""

import argparse
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_edge_import_does_not_pull_in_jax_or_mujoco():
    """Nor the console's web server or image library: the edge's console link imports Pillow only
    when it streams a camera."""
    code = ("import sys, embodyrl.hal, embodyrl.hal.actor, embodyrl.hal.console, embodyrl.hal.wire.client, "
            "embodyrl.envs; bad = [m for m in ('jax', 'flax', 'optax', 'mujoco', 'starlette', 'uvicorn', 'PIL') "
            "if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"importing the edge pulled in: {out.stdout} {out.stderr}"


def _sources() -> dict[str, Path]:
    """Every file of the package folders (``package-dir``) by its path once installed:
    ``hal/wire/client.py`` -> ``embodyrl/hal/wire/client.py``."""
    found = {}
    for package, folder in SETUPTOOLS["package-dir"].items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found["/".join([*package.split("."), *path.relative_to(ROOT / folder).parts])] = path
    return found


def test_every_package_folder_is_listed_in_pyproject():
    """Every folder of Python files is a package (an ``__init__.py``) that pyproject lists: a folder
    without one (``embodyrl/cluster`` was) works from the checkout and is missing from the wheel."""
    folders = {path.parent for name, path in _sources().items() if name.endswith(".py")}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists()) == []
    packages = {".".join(name.split("/")[:-1]) for name in _sources() if name.endswith("/__init__.py")}
    assert packages == set(SETUPTOOLS["packages"])


def test_the_wheel_holds_every_module_and_data_file(built_wheel):
    """Each ``*.py`` and each other file of the package folders (MuJoCo models, the console's page,
    the coupling library's C sources) is in the wheel, at its installed path."""
    in_wheel = set(zipfile.ZipFile(built_wheel).namelist())
    assert sorted(set(_sources()) - in_wheel) == []


def test_installed_package_is_this_checkout():
    import embodyrl
    import embodyrl.envs
    import embodyrl.hal

    assert Path(embodyrl.__file__).resolve().parent == ROOT / "embodyrl"
    assert Path(embodyrl.hal.__file__).resolve().parent == ROOT / "hal"
    assert Path(embodyrl.envs.__file__).resolve().parent == ROOT / "envs"


# -- the base install: pip install embodyrl, no extras ---------------------------------------------

def _command_paths(parser: argparse.ArgumentParser, prefix: tuple = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand of ``parser``: ("train",), ..., ("reward",), ("reward", "train")."""
    paths = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += [(*prefix, name), *_command_paths(sub, (*prefix, name))]
    return paths


def _commands() -> list[tuple[str, ...]]:
    from embodyrl.cli.commands import build_parser

    return _command_paths(build_parser())


HELP = """
import contextlib, io, json, sys, traceback
from embodyrl.cli.commands import main

answers = {}
for path in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main([*path, "--help"])
        except SystemExit as exit_:
            code = exit_.code
        except Exception:
            traceback.print_exc()
            code = "raised"
    answers[" ".join(path)] = [code, err.getvalue()[-2000:]]
print(json.dumps(answers))
"""


def test_every_command_help_runs_on_the_base_install(base_install):
    """``embodyrl COMMAND --help`` of every command the parser has, in one process of the base
    install: building the parser imports no extra."""
    top = base_install.run("--help")
    assert top.returncode == 0 and "Traceback" not in top.stderr, top.stderr
    paths = _commands()
    done = subprocess.run([str(base_install.python), "-c", HELP, json.dumps(paths)], capture_output=True,
                          text=True, cwd=base_install.cwd, env=base_install.env(), timeout=120)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    assert sorted(answers) == sorted(" ".join(p) for p in paths)
    failed = {path: err for path, (code, err) in answers.items() if code != 0}
    assert failed == {}


def _finished_run(directory: Path) -> Path:
    """A directory that passes for a finished run (config.json and policy/) up to loading it."""
    (directory / "policy").mkdir(parents=True)
    (directory / "config.json").write_text("{}\n")
    return directory


def _demos(directory: Path) -> Path:
    """Two demonstrations with a camera field, a success and a failure, as ``embodyrl record`` writes them."""
    from embodyrl.hal.demos import DemoWriter
    from embodyrl.hal.specs import ArraySpec, DictSpec
    from embodyrl.hal.steps import PolicyVersion, StepRecorder

    directory.mkdir()
    obs = DictSpec.of(ArraySpec("camera/front", (8, 8, 3), np.uint8))
    act = ArraySpec("action", (1,), np.float32, -1, 1)
    for i, success in enumerate((True, False)):
        recorder = StepRecorder(obs, act, actor_id=0, device_id=0, capacity=5)
        frame = {"camera/front": np.full((8, 8, 3), 40 * i, np.uint8)}
        for t in range(4):
            recorder.add(frame, np.zeros(1, np.float32), np.zeros(1, np.float32), 0.0, False, t == 3,
                         PolicyVersion(0, 0))
        recorder.add_final(frame)
        writer = DemoWriter(directory / f"episode-{i:05d}.npz", obs, act)
        writer.add(recorder.flush())
        writer.close(success=success, labelled_by="task")
    return directory


def _extra(name: str) -> str:
    return f"pip install 'embodyrl[{name}]'"


# command line on the base install (after "embodyrl"; {tmp}: a fresh directory, {run}: a finished
# run's, {demos}: demonstrations) -> the exit code, and what stderr (or stdout, when 0) must say
ON_THE_BASE_INSTALL = {
    "train": ("train pendulum --steps 10 --run-dir {tmp}/run", 2, _extra("learner")),
    "train-gym": ("train gym:Pendulum-v1 --steps 10 --run-dir {tmp}/run", 2, _extra("gym")),
    "launch-ray": ("launch ray pendulum --steps 10 --run-dir {tmp}/run", 2, _extra("ray")),
    "launch-slurm": ("launch slurm pendulum --steps 10 --run-dir {tmp}/run --dry-run", 2, _extra("learner")),
    "learner": ("learner pendulum --steps 10 --run-dir {tmp}/run", 2, _extra("learner")),
    "learner-coupling": ("learner coupling --config {tmp}/coupling.yaml --run-dir {tmp}/run", 2, _extra("learner")),
    "eval": ("eval {run}", 2, _extra("learner")),
    "export": ("export {run} {tmp}/policy", 2, _extra("learner")),
    "plot": ("plot {run} --out {tmp}/curves.png", 2, _extra("plot")),
    "bench": ("bench algos --quick", 2, _extra("learner")),
    "bench-console": ("bench console --quick", 2, _extra("console")),
    "bench-scale": ("bench scale --quick", 2, _extra("ray")),
    "record": ("record pendulum --teleop keyboard --episodes 1 --out {tmp}/demos", 2, _extra("mujoco")),
    "robot-server": ("robot-server embodyrl.envs.arm:make_device", 2, _extra("mujoco")),
    "console": ("console {run}", 2, _extra("console")),
    "reward": ("reward train {demos} --out {tmp}/classifier --held-out 0", 2, _extra("learner")),
    # what runs on the base install
    "keys": ("keys {tmp}/keys robot", 0, "public key"),
    "tasks": ("tasks", 0, "pendulum"),
    "demos": ("demos {demos}", 0, "2 episodes in 2 files"),
    "replay": ("replay {tmp}", 2, "no replay"),
    "relay": ("relay --connect tcp://127.0.0.1:9 --handshake-timeout-s 0.5", 1, "no WELCOME"),
}
NOT_HERE = {"actor"}  # runs on the base install: its tests are the edge's


def test_every_command_is_run_on_the_base_install():
    assert {line.split()[0] for line, _, _ in ON_THE_BASE_INSTALL.values()} | NOT_HERE == \
        {path[0] for path in _commands()}


@pytest.mark.parametrize("name", sorted(ON_THE_BASE_INSTALL))
def test_a_command_names_the_extra_it_lacks(base_install, tmp_path, name):
    """One line naming the extra and its pip command, exit code 2, no traceback; or, for what needs
    no extra, the command's own answer."""
    line, code, says = ON_THE_BASE_INSTALL[name]
    (tmp_path / "coupling.yaml").write_text("coupling: {}\n")
    places = {"tmp": tmp_path, "run": tmp_path / "finished", "demos": tmp_path / "recorded"}
    if "{run}" in line:
        _finished_run(places["run"])
    if "{demos}" in line:
        _demos(places["demos"])
    done = base_install.run(*[word.format(**places) for word in line.split()])
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, done.stderr
    assert says in (done.stdout if code == 0 else done.stderr), (done.stdout, done.stderr)
    if code == 2 and says.startswith("pip install"):  # one line, the last: the command stops there
        assert [said for said in done.stderr.splitlines() if "pip install" in said] == \
            done.stderr.splitlines()[-1:], done.stderr
        assert not (tmp_path / "run").exists(), "a refusal writes no run directory (docs/cli.md)"


def test_a_base_install_actor_acts_for_a_full_install_learner_and_its_rows_reach_the_replay(base_install, tmp_path):
    """The robot PC as shipped: ``pip install embodyrl`` (no JAX, no MuJoCo) runs ``embodyrl actor`` for a
    numpy-only robot against ``embodyrl learner`` of the full install, over loopback."""
    from embodyrl.replay.contents import rows_added

    shutil.copy(Path(__file__).parent / "robot_helpers.py", base_install.cwd)  # the robot's code, beside both
    run_dir = tmp_path / "run"
    learner = subprocess.Popen([sys.executable, "-m", "embodyrl.cli", "learner", "robot_helpers:point_mass",
                                "--run-dir", str(run_dir), "--steps", "300", "--actor.random_steps", "1000",
                                "--learner.min_replay", "1000"], cwd=base_install.cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        endpoint = json.loads(learner.stdout.readline())["endpoint"]
        actor = base_install.run("actor", "robot_helpers:point_mass", "--connect", endpoint, "--index", "0",
                                 "--config", run_dir / "config.json", "--max-steps", "400", timeout=180)
        out, err = learner.communicate(timeout=120)
    finally:
        if learner.poll() is None:
            learner.kill()
    assert actor.returncode == 0, actor.stderr
    assert "acting with the numpy runtime" in actor.stderr and "Traceback" not in actor.stderr
    assert learner.returncode == 0, err
    counters = json.loads(out.strip().splitlines()[-1])
    assert counters["rows"] >= 300 and rows_added(run_dir / "replay") == counters["rows"]


def test_the_robot_guides_robot_pc_steps_run_on_the_base_install(base_install, tmp_path):
    """docs/robots.md's robot-PC side on ``pip install embodyrl`` alone: key pairs, the robot server holding
    them, and ``embodyrl actor`` driving the robot through it for a learner of the full install."""
    import yaml

    cwd = base_install.cwd / "robot-pc"
    cwd.mkdir()
    shutil.copy(Path(__file__).parent / "robot_helpers.py", cwd)  # the robot's driver, a numpy stand-in
    for name in ("robot", "actor"):
        made = base_install.run("keys", f"keys/{name}", name, cwd=cwd)
        assert made.returncode == 0, made.stderr
    (cwd / "keys" / "authorized").mkdir()
    shutil.copy(cwd / "keys" / "actor" / "actor.key", cwd / "keys" / "authorized")
    server = subprocess.Popen(
        [str(base_install.python), "-m", "embodyrl.hal.robot_server", "robot_helpers:point_mass_device",
         "--bind", "tcp://127.0.0.1:*", "--watchdog-s", "60", "--secret-key", "keys/robot/robot.key_secret",
         "--authorized-keys", "keys/authorized"], cwd=cwd, env=base_install.env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    learner = None
    try:
        line = server.stdout.readline()
        assert line.startswith("robot server on tcp://"), (line, server.stderr.read() if server.poll() else "")
        (cwd / "point.yaml").write_text(yaml.safe_dump({
            "name": "point",
            "device": {"endpoint": line.split()[-1], "timeout_s": 1.0, "retries": 1,
                       "keys": {"secret_key": "keys/actor/actor.key_secret", "server_key": "keys/robot/robot.key"}},
            "task": {"factory": "robot_helpers:point_mass_task"},
            "control": {"rate_hz": 50, "episode_steps": 50, "realtime": False}}, sort_keys=False))
        learner = subprocess.Popen([sys.executable, "-m", "embodyrl.cli", "learner", "point.yaml", "--run-dir", "run",
                                    "--steps", "300", "--actor.random_steps", "1000", "--learner.min_replay", "1000"],
                                   cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, text=True)
        endpoint = json.loads(learner.stdout.readline() or "{}").get("endpoint")
        assert endpoint, learner.stderr.read() if learner.poll() is not None else "no endpoint"
        actor = base_install.run("actor", "point.yaml", "--connect", endpoint, "--index", "0", "--config",
                                 "run/config.json", "--max-steps", "400", cwd=cwd, timeout=180)
        assert actor.returncode == 0, actor.stderr
        assert "acting with the numpy runtime" in actor.stderr
        out, err = learner.communicate(timeout=120)
        assert learner.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["rows"] >= 300
    finally:
        for process in (learner, server):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(30)
