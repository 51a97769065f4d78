"""Your own robot, declared: every form a task is named in, robot files refused by field, and
runs rebuilt from what config.json recorded (``--resume``, ``eval``, ``export``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from embodyrl import robot
from embodyrl.hal.safety import SafeDevice
from tests.cli_helpers import in_process
from tests.robot_helpers import served_with_keys

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "robots"
TESTS = Path(__file__).resolve().parent
TINY = ("--steps", "200", "--eval_episodes", "1", "--ddpg.hidden_sizes", "[16, 16]", "--learner.min_replay", "100",
        "--actor.random_steps", "100", "--learner.updates_per_call", "4", "--quiet")
"""A run of a few hundred steps with small networks."""


def cli(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """``embodyrl ARGS...`` with this directory's helpers importable (``robot_helpers:NAME``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "embodyrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def local_arm(**changes) -> dict:
    """The shipped local arm's declaration, with ``changes`` (dotted keys) applied; episodes of 50 steps."""
    data = yaml.safe_load((EXAMPLES / "arm_local.yaml").read_text())
    data["control"]["episode_steps"] = 50
    for key, value in changes.items():
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        elif value is _DROP:
            del node[last]
        else:
            node[last] = value
    return data


_DROP = object()


def write(path: Path, data) -> str:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return str(path)


# -- every form, in this process ----------------------------------------------------

def test_builtin_names_gym_ids_and_several_kinds_work_as_before():
    pendulum = robot.load("pendulum")
    assert pendulum.builtin and pendulum.names == ("pendulum",) and pendulum.record() == {}
    assert pendulum.reset == "auto" and pendulum.camera_fields == ()
    assert pendulum.layout().kinds[0].name == "pendulum"
    both = robot.load("pendulum+arm_reach")
    assert both.names == ("pendulum", "arm_reach") and both.layout().padded
    with pytest.raises(ValueError, match="several device kinds"):
        both.make()
    with pytest.raises(robot.RobotFileError, match=r"unknown task 'cartwheel'; known: .*module:factory.*robot file"):
        robot.load("cartwheel")
    with pytest.raises(robot.RobotFileError, match="names device kind .pendulum. twice"):
        robot.load("pendulum+pendulum")


def test_a_module_factory_is_a_robot_and_is_recorded_with_its_specs():
    made = robot.load("robot_helpers:pendulum")
    assert not made.builtin and made.names == ("robot_helpers:pendulum",)
    device, task = made.make()
    assert task.max_episode_steps == 200
    record = made.record()
    assert record["source"] == "robot_helpers:pendulum" and "files" not in record
    assert record["layout"][0]["action_spec"] == device.action_spec.to_msg()
    with pytest.raises(robot.RobotFileError, match="cannot import 'no_such_module'"):
        robot.load("no_such_module:make")
    with pytest.raises(robot.RobotFileError, match="module 'robot_helpers' has no 'nothing'"):
        robot.load("robot_helpers:nothing")
    with pytest.raises(robot.RobotFileError, match=r"must return \(device, task\)"):
        robot.load("robot_helpers:not_a_pair").make()
    mixed = robot.load("pendulum+robot_helpers:pendulum")  # kinds of different forms in one run
    assert mixed.names == ("pendulum", "robot_helpers:pendulum")


def test_a_robot_file_builds_its_device_task_safety_and_rate(tmp_path):
    arm = robot.load(write(tmp_path / "arm.yaml", local_arm(**{"control.rate_hz": 25, "cameras": []})))
    assert arm.names == ("arm",) and arm.reset == "auto"
    assert arm.config_defaults() == {"actor": {"realtime": False, "reset": "auto"}}
    kind = arm.layout().kinds[0]
    assert list(kind.observation_spec) == ["ee_pos", "qpos", "qvel", "target_pos"]
    device, task = arm.make()
    assert isinstance(device, SafeDevice) and device.control_period_s == pytest.approx(0.04)
    assert device.config.max_delta == 40.0 and device.config.workspace.field == "ee_pos"
    assert task.max_episode_steps == 50 and task.success_reward is None  # dense: a label leaves rewards alone
    with device:
        observation = device.reset(seed=0)
        action = np.full(7, 30.0, np.float32)
        after = device.step(action)
        assert device.interventions["rate_limited"] == 0 and device.last_applied[0] == 30.0
        device.step(np.full(7, -30.0, np.float32))
        assert device.interventions["rate_limited"] == 1  # 60 N m in one step: held to 40
    gap = float(np.linalg.norm(after["ee_pos"] - after["target_pos"]))
    expected = -gap - 1e-4 * float(np.sum(action.astype(np.float64) ** 2)) + (1.0 if gap < 0.05 else 0.0)
    assert task.reward(observation, action, after) == pytest.approx(expected, rel=1e-5)
    assert task.episode_metrics([observation, after]) == {"success": float(gap < 0.05)}
    reached = {**after, "target_pos": after["ee_pos"]}
    assert task.success(reached) and task.episode_metrics([reached]) == {"success": 1.0}


def test_a_robot_file_with_a_task_factory_and_sparse_rewards(tmp_path):
    factory = local_arm(**{"task": {"factory": "robot_helpers:reach_task", "args": {"steps": 30}}})
    factory["control"].pop("episode_steps")
    _, task = robot.load(write(tmp_path / "a.yaml", factory)).make()
    assert type(task).__name__ == "Reach" and task.max_episode_steps == 30
    sparse = local_arm(**{"task.reward.terms": [], "task.end_on_success": True, "reset": "operator",
                          "task.reward.success": [{"within_distance": ["ee_pos", "target_pos", 0.1], "value": 2.0},
                                                  {"below": ["qvel", 100.0]}]})
    made = robot.load(write(tmp_path / "b.yaml", sparse))
    _, task = made.make()
    assert made.reset == "operator" and task.success_reward == 3.0
    far = {"ee_pos": np.zeros(3), "target_pos": np.ones(3), "qvel": np.zeros(7)}
    near = {**far, "target_pos": np.full(3, 0.01)}
    assert task.reward(far, np.zeros(7), far) == 1.0 and not task.terminated(far)  # qvel below 100 only
    assert task.reward(far, np.zeros(7), near) == 3.0 and task.terminated(near)


BAD = [
    ({"task.reward.terms.1.weight": "x"}, "task.reward.terms[1].weight: expected a number, got 'x'"),
    ({"colour": "red"}, "colour: unknown field; known: name, device, end_effector, task"),
    ({"device": _DROP}, "device: missing"),
    ({"device.endpoint": "tcp://127.0.0.1:5556"}, "device: give exactly one of factory, lerobot, endpoint; got factory, endpoint"),
    ({"device.factory": "no_such_module:make"}, "device.factory: cannot import 'no_such_module'"),
    ({"device.factory": "not a factory"}, "device.factory: expected package.module:callable"),
    ({"device": {"endpoint": "tcp://10.1.2.3:5556"}}, "device.keys: tcp://10.1.2.3:5556 is off this machine"),
    ({"device": {"endpoint": "tcp://127.0.0.1:5556", "args": {"x": 1}}},
     "device.args: belongs to a device factory, not a remote device"),
    ({"device": {"endpoint": "tcp://127.0.0.1:5556", "keys": {"secret_key": "a.key_secret", "server_key": "b.key"}}},
     "device.keys.secret_key: no file"),
    ({"reset": "manual"}, "reset: expected one of auto, operator, got 'manual'"),
    ({"control.rate_hz": -5}, "control.rate_hz: must be > 0, got -5"),
    ({"control.episode_steps": 0}, "control.episode_steps: must be at least 1, got 0"),
    ({"control.episode_steps": _DROP}, "control.episode_steps: missing: a declared reward needs the episode length"),
    ({"control.realtime": "yes"}, "control.realtime: expected true or false, got 'yes'"),
    ({"task.reward.terms.0.distance": ["ee_pos"]}, "task.reward.terms[0].distance: expected a list of 2 field names"),
    ({"task.reward.terms.1.name": "distance"}, "task.reward.terms: names must differ"),
    ({"task.reward.terms.0": {"weight": 1.0}}, "task.reward.terms[0]: give exactly one of distance, norm, squared"),
    ({"task.reward.success.0.within_distance": ["ee_pos", "target_pos", 0]},
     "task.reward.success[0].within_distance[2]: must be > 0, got 0"),
    ({"task.reward": {}}, "task.reward: declare terms, success conditions, or both"),
    ({"task.reward.success": [], "task.end_on_success": True}, "task.end_on_success: needs success conditions"),
    ({"safety.workspace.0.low": [2.0, 0.0, 0.0]}, "safety.workspace[0]: low (2.0, 0.0, 0.0) is above high"),
    ({"safety.max_delta": "fast"}, "safety.max_delta: expected a number, got 'fast'"),
    ({"cameras": "front"}, "cameras: expected a list of some field names, got 'front'"),
]


@pytest.mark.parametrize(("changes", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_a_bad_robot_file_is_refused_naming_the_field(tmp_path, changes, message):
    path = write(tmp_path / "robot.yaml", local_arm(**changes))
    with pytest.raises(robot.RobotFileError) as caught:
        robot.load(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value), str(caught.value)


def test_what_only_the_specs_tell_is_refused_by_the_layout(tmp_path):
    for changes, message in (({"task.reward.terms.0.distance": ["ee", "target_pos"]},
                               "task.reward.terms[0].distance[0]: 'ee' is not an observation field; "
                               "the robot observes ee_pos, qpos, qvel, target_pos"),
                              ({"cameras": ["qpos"]}, "cameras[0]: 'qpos' is float32[7], not an HxWxC uint8 image"),
                              ({"safety.safe_action": [1.0, 2.0]}, "safety: safe_action: shape (2,)")):
        made = robot.load(write(tmp_path / "robot.yaml", local_arm(**changes)))
        with pytest.raises(robot.RobotFileError, match=re.escape(message)):
            made.layout()
    for text, message in (("device: [", "not valid YAML"), ("- a\n- b\n", "expected a mapping at the top")):
        with pytest.raises(robot.RobotFileError, match=message):
            robot.load(write(tmp_path / "robot.yaml", text))


def test_a_run_rebuilds_its_robot_from_the_record_and_refuses_a_changed_file(tmp_path):
    path = write(tmp_path / "arm.yaml", local_arm())
    config = SimpleNamespace(task="arm.yaml", robot=robot.load(path).record())
    json.dumps(config.robot)  # config.json holds it
    assert config.robot["files"][path]["path"] == str(Path(path).resolve())
    rebuilt = robot.of_config(SimpleNamespace(task=path, robot=config.robot))
    assert rebuilt.names == ("arm",) and rebuilt.recorded_layout is not None
    assert robot.layout_of(config) == rebuilt.layout()
    config = SimpleNamespace(task=path, robot=config.robot)
    write(tmp_path / "arm.yaml", local_arm(**{"control.episode_steps": 80, "reset": "operator"}))
    with pytest.raises(robot.RobotFileError, match=r"changed since the run started \(control.episode_steps: 50 -> 80; "
                                                   r"reset: 'auto' -> 'operator'\)"):
        robot.of_config(config)
    Path(path).unlink()  # gone (another machine): rebuilt from the recorded declaration
    _, task = robot.of_config(config).make()
    assert task.max_episode_steps == 50


def test_the_learner_takes_the_recorded_layout_without_reaching_the_robot(tmp_path):
    remote = local_arm(device={"endpoint": "tcp://127.0.0.1:9"})  # nothing listens there
    path = write(tmp_path / "remote.yaml", remote)
    recorded = robot.load(write(tmp_path / "local.yaml", local_arm())).record()["layout"]
    config = SimpleNamespace(task=path, robot={"source": path, "layout": recorded})
    assert robot.layout_of(config).kinds[0].name == "arm"


def test_cameras_set_the_encoders_image_fields():
    made = robot.Robot("x", camera_fields=("front",))
    assert made.config_defaults()["sac"] == {"encoder": {"image_fields": ["front"]}}
    assert "ppo" not in made.config_defaults()  # no encoder there


def test_reward_only_fields_set_the_encoders_ignore_fields(tmp_path):
    both = robot.Robot("x", camera_fields=("front",), reward_only=("wrist",))
    assert both.config_defaults()["sac"] == {"encoder": {"image_fields": ["front"], "ignore_fields": ["wrist"]}}
    assert robot.Robot("x", reward_only=("wrist",)).config_defaults()["ddpg"] == {"encoder": {"ignore_fields": ["wrist"]}}
    made = robot.load(write(tmp_path / "arm.yaml", local_arm(reward_only=["qvel"])))
    assert made.reward_only == ("qvel",) and made.config_defaults()["sac"]["encoder"] == {"ignore_fields": ["qvel"]}
    config = _resolved(["train", "arm.yaml", "--algorithm", "sac"], tmp_path, tmp_path / "run")
    assert config.sac.encoder.ignore_fields == ("qvel",)  # checked against the specs too
    with pytest.raises(robot.RobotFileError, match=r"reward_only\[0\]: 'wrist' is not an observation field"):
        robot.load(write(tmp_path / "arm.yaml", local_arm(reward_only=["wrist"]))).layout()
    with pytest.raises(robot.RobotFileError, match=r"arm.yaml: reward_only\[1\]: 'qpos' is in cameras too"):
        robot.load(write(tmp_path / "arm.yaml", local_arm(cameras=["qpos"], reward_only=["qvel", "qpos"])))
    with pytest.raises(robot.RobotFileError, match="reward_only: expected a list of some field names"):
        robot.load(write(tmp_path / "arm.yaml", local_arm(reward_only="qvel")))


# -- through the command line ----------------------------------------------------------

def test_the_cli_refuses_a_bad_robot_file_with_exit_2_before_anything_starts(tmp_path):
    write(tmp_path / "robot.yaml", local_arm(**{"task.reward.terms.1.weight": "x"}))
    proc = in_process("train", "robot.yaml", "--run-dir", "run", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "robot.yaml: task.reward.terms[1].weight: expected a number, got 'x'" in proc.stderr
    assert not (tmp_path / "run").exists()
    write(tmp_path / "robot.yaml", local_arm(**{"task.reward.terms.0.distance": ["ee", "target_pos"]}))
    proc = in_process("learner", "robot.yaml", "--run-dir", "run", cwd=tmp_path)
    assert proc.returncode == 2 and "task.reward.terms[0].distance[0]: 'ee' is not an observation field" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_the_cli_resolves_each_form_and_records_where_it_came_from(tmp_path, monkeypatch):
    from embodyrl.cli.commands import _resolve_config, build_parser

    monkeypatch.chdir(tmp_path)
    write(tmp_path / "arm.yaml", local_arm())
    parser = build_parser()
    for source in ("pendulum", "robot_helpers:pendulum", "arm.yaml"):
        args, extra = parser.parse_known_args(["train", source, "--actor.send_every", "32"])
        args.overrides = extra
        config = _resolve_config(args, tmp_path / source.replace(":", "-"))
        assert config.task == source and config.actor.send_every == 32
        if source == "pendulum":
            assert config.robot == {}
        else:
            assert config.robot["source"] == source and config.robot["layout"]
    assert config.robot["files"]["arm.yaml"]["path"] == str((tmp_path / "arm.yaml").resolve())
    assert not config.actor.realtime  # control.realtime: false
    args, extra = parser.parse_known_args(["train", "arm.yaml", "--actor.realtime", "true"])
    args.overrides = extra
    assert _resolve_config(args, tmp_path / "r2").actor.realtime  # the user's setting wins
    write(tmp_path / "arm.yaml", local_arm(reset="operator"))
    args, extra = parser.parse_known_args(["train", "arm.yaml"])
    args.overrides = extra
    assert _resolve_config(args, tmp_path / "r3").actor.reset == "operator"  # the actor waits for a person


@pytest.fixture(scope="module")
def arm_run(tmp_path_factory):
    """A tiny run of a robot file (a copy of the local arm's, 50-step episodes)."""
    home = tmp_path_factory.mktemp("arm")
    write(home / "arm.yaml", local_arm())
    proc = cli("train", "arm.yaml", "--run-dir", "run", *TINY, cwd=home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return home


def test_train_a_robot_file_then_eval_and_export_rebuild_it(arm_run):
    config = json.loads((arm_run / "run" / "config.json").read_text())
    assert config["task"] == "arm.yaml" and config["robot"]["files"]["arm.yaml"]["path"] == str(arm_run / "arm.yaml")
    assert json.loads((arm_run / "run" / "summary.json").read_text())["env_steps"] >= 200
    elsewhere = arm_run / "elsewhere"
    elsewhere.mkdir(exist_ok=True)  # the recorded absolute path finds the file from any directory
    proc = in_process("eval", str(arm_run / "run"), "--episodes", "1", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["task"] == "arm.yaml" and "success_mean" in result
    proc = in_process("export", str(arm_run / "run"), "policy", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    from embodyrl.hal import runtime

    policy = runtime.load(elsewhere / "policy", seed=0)
    device, _ = robot.load(str(arm_run / "arm.yaml")).make()
    with device:
        action, _ = policy.act(device.reset(seed=0), explore=False)
    assert action.shape == (7,)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "numpy_actor.py"), "policy", "--task",
                           str(arm_run / "arm.yaml"), "--max-steps", "20"], capture_output=True, text=True,
                          cwd=elsewhere, timeout=120)  # the robot PC: the robot file, numpy alone
    assert proc.returncode == 0, proc.stderr
    assert '"jax_imported": false' in proc.stdout


def test_the_docs_show_the_shipped_robot_file():
    page = (ROOT / "docs" / "robots.md").read_text()
    block = re.search(r"saved here as `arm.yaml`:\n\n```yaml\n(.*?)^```", page, re.S | re.M)
    assert block is not None and block.group(1) == (EXAMPLES / "arm.yaml").read_text()
    local = yaml.safe_load((EXAMPLES / "arm_local.yaml").read_text())
    remote = yaml.safe_load((EXAMPLES / "arm.yaml").read_text())
    assert {k: v for k, v in local.items() if k not in ("device", "control")} == \
        {k: v for k, v in remote.items() if k not in ("device", "control", "cameras")}  # the same arm, task, limits


def _resolved(argv: list[str], cwd: Path, run_dir: Path | None):
    """``_resolve_config`` of a command line, in ``cwd``: what the command would run."""
    from embodyrl.cli.commands import _demos, _resolve_config, build_parser

    args, extra = build_parser().parse_known_args(argv)
    args.overrides = extra
    before = os.getcwd()
    os.chdir(cwd)
    try:
        return _resolve_config(args, run_dir, _demos(args) if hasattr(args, "demos") else None)
    finally:
        os.chdir(before)


def test_resume_rebuilds_the_robot_from_config_json_and_refuses_a_changed_file(arm_run):
    recorded = json.loads((arm_run / "run" / "config.json").read_text())["robot"]
    elsewhere = arm_run / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    for name in ("arm.yaml", str(arm_run / "arm.yaml")):  # the same file by another path
        config = _resolved(["train", name, "--run-dir", str(arm_run / "run"), "--resume", "--steps", "400"],
                           elsewhere if name != "arm.yaml" else arm_run, arm_run / "run")
        assert config.task == "arm.yaml" and config.robot == recorded and config.steps == 400
    original = (arm_run / "arm.yaml").read_text()
    write(arm_run / "arm.yaml", local_arm(**{"safety.max_delta": 10.0}))
    try:
        proc = in_process("train", "arm.yaml", "--run-dir", "run", "--resume", *TINY, cwd=arm_run)
        assert proc.returncode == 2
        assert "arm.yaml: the robot file changed since the run started (safety.max_delta: 40.0 -> 10.0)" in proc.stderr
        proc = in_process("eval", "run", cwd=arm_run)
        assert proc.returncode == 2 and "changed since the run started" in proc.stderr
    finally:
        (arm_run / "arm.yaml").write_text(original)
    write(elsewhere / "arm.yaml", local_arm())
    proc = in_process("train", "arm.yaml", "--run-dir", str(arm_run / "run"), "--resume", cwd=elsewhere)
    assert proc.returncode == 2  # another file of the same name is another robot
    assert f"is a run of 'arm.yaml' ({(arm_run / 'arm.yaml').resolve()}), not 'arm.yaml'" in proc.stderr


@pytest.mark.slow
def test_resume_continues_a_robot_file_run(arm_run):
    proc = cli("train", str(arm_run / "arm.yaml"), "--run-dir", "run", "--resume", *TINY, "--steps", "300",
               cwd=arm_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((arm_run / "run" / "summary.json").read_text())["env_steps"] >= 300


def test_an_actor_takes_its_own_robot_file_and_the_learners_config(arm_run):
    here = arm_run / "robot-pc"
    here.mkdir(exist_ok=True)
    shutil.copy(arm_run / "arm.yaml", here / "arm.yaml")
    config = _resolved(["actor", "arm.yaml", "--connect", "tcp://127.0.0.1:5555", "--config",
                        str(arm_run / "run" / "config.json")], here, None)
    assert config.robot["files"]["arm.yaml"]["path"] == str((here / "arm.yaml").resolve())  # this machine's file
    assert config.learner.min_replay == 100  # the learner's settings


def test_train_a_module_factory(tmp_path):
    proc = cli("train", "robot_helpers:pendulum", "--run-dir", "run", *TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["task"] == "robot_helpers:pendulum" and config["robot"]["layout"][0]["name"] == "robot_helpers:pendulum"


def test_train_a_remote_robot_through_a_robot_server_with_keys(tmp_path):
    server, endpoint = served_with_keys(tmp_path, "embodyrl.envs.arm:make_device")
    try:
        data = yaml.safe_load((EXAMPLES / "arm.yaml").read_text())  # the shipped file, on this server's port
        data["device"].update(endpoint=endpoint, retries=1)  # loopback loses nothing; a dead server fails fast
        data["control"].update(episode_steps=50, realtime=False)
        write(tmp_path / "arm.yaml", data)
        proc = cli("train", "arm.yaml", "--run-dir", "run", *TINY, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        config = json.loads((tmp_path / "run" / "config.json").read_text())
        assert config["robot"]["files"]["arm.yaml"]["declaration"]["device"]["endpoint"] == endpoint
        proc = in_process("eval", "run", "--episodes", "1", cwd=tmp_path)
        assert proc.returncode == 0 and "return_mean" in proc.stdout, proc.stderr
    finally:
        server.terminate()
        server.wait(30)
    proc = in_process("train", "arm.yaml", "--run-dir", "run2", *TINY, cwd=tmp_path)  # the server is gone
    assert proc.returncode == 2 and "arm.yaml: device.endpoint: " in proc.stderr, proc.stderr


def test_demos_directories_become_learner_demos(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    config = _resolved(["train", "pendulum", "--demos", "a", "--demos", "b"], tmp_path, tmp_path / "run")
    assert config.learner.demos == (str((tmp_path / "a").resolve()), str((tmp_path / "b").resolve()))
    config = _resolved(["learner", "pendulum", "--demos", "a"], tmp_path, tmp_path / "run")
    assert config.learner.demos == (str((tmp_path / "a").resolve()),)
    proc = in_process("train", "pendulum", "--demos", "nowhere", "--run-dir", "run", cwd=tmp_path)
    assert proc.returncode == 2 and "--demos: no directory nowhere" in proc.stderr and not (tmp_path / "run").exists()


def test_eval_of_a_robot_reset_by_hand_waits_for_the_person_and_takes_their_labels(arm_run, tmp_path):
    import shutil

    from embodyrl.cli.launch import evaluate_run
    from embodyrl.config import load

    run = tmp_path / "run"
    shutil.copytree(arm_run / "run", run)
    config = json.loads((run / "config.json").read_text())
    config["actor"]["reset"] = "operator"
    (run / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "embodyrl.cli", "eval", str(run), "--episodes", "3"],
                          input="sxfs", capture_output=True, text=True, timeout=300, cwd=arm_run, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("reset the scene") == 3  # asked after every episode
    assert json.loads(proc.stdout)["success_mean"] == pytest.approx(2 / 3)  # x is no answer: s, f, s
    proc = subprocess.run([sys.executable, "-m", "embodyrl.cli", "eval", str(run), "--episodes", "2"],
                          input="s", capture_output=True, text=True, timeout=300, cwd=arm_run, env=env)
    assert proc.returncode == 1 and "operator's input closed" in proc.stderr  # no one answers: said, not hung
    assert "eval_skipped" in evaluate_run(load(run / "config.json"), run)  # train leaves it to the person
