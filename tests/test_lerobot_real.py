"""LeRobot's own classes under embodyrl: a ``Robot`` and a ``Teleoperator`` derived from LeRobot's ABCs,
registered as a LeRobot plugin package is (``lerobot_robot_*``, found by LeRobot's own plugin
discovery), named by type in a robot file, served by the robot server, recorded, trained, evaluated
and exported; and the shipped SO-101 file read by LeRobot's own SO-101 class (no motors here).

Slow, and only where LeRobot is installed (``pip install 'embodyrl[lerobot]'``: it brings torch).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from embodyrl import robot
from embodyrl.envs.lerobot_arm import BOUNDS, HOME, NAMES

sys.path.insert(0, str(Path(__file__).resolve().parent))  # draccus, which LeRobot brings, ships a top-level
from cli_helpers import in_process  # noqa: E402  ``tests`` package that shadows this directory's in its venv
from robot_helpers import served_with_keys  # noqa: E402

pytestmark = pytest.mark.slow
lerobot = pytest.importorskip("lerobot", reason="LeRobot is not installed here: pip install 'embodyrl[lerobot]'")

ROOT = Path(__file__).resolve().parent.parent
SO101 = ROOT / "examples" / "robots" / "so101.yaml"
PLUGIN = "lerobot_robot_embodyrl_sim"
PLUGIN_SOURCE = '''
"""The simulated arm and a scripted leader as LeRobot classes: LeRobot's ABCs, its config registry."""
from dataclasses import dataclass, field

from lerobot.robots import Robot, RobotConfig
from lerobot.teleoperators import Teleoperator, TeleoperatorConfig

from embodyrl.envs.lerobot_arm import ScriptedLeader, SimulatedFollower


@RobotConfig.register_subclass("embodyrl_sim_follower")
@dataclass
class EmbodyrlSimFollowerConfig(RobotConfig):
    cameras: dict = field(default_factory=dict)
    substeps: int = 10


class EmbodyrlSimFollower(SimulatedFollower, Robot):
    config_class = EmbodyrlSimFollowerConfig
    name = "embodyrl_sim_follower"

    def __init__(self, config):
        Robot.__init__(self, config)
        SimulatedFollower.__init__(self, cameras=config.cameras, substeps=config.substeps, id=config.id or "sim")


@TeleoperatorConfig.register_subclass("embodyrl_scripted_leader")
@dataclass
class EmbodyrlScriptedLeaderConfig(TeleoperatorConfig):
    rest_polls: int = 10
    move_polls: int = 50
    hold_polls: int = 40


class EmbodyrlScriptedLeader(ScriptedLeader, Teleoperator):
    config_class = EmbodyrlScriptedLeaderConfig
    name = "embodyrl_scripted_leader"

    def __init__(self, config):
        Teleoperator.__init__(self, config)
        ScriptedLeader.__init__(self, rest_polls=config.rest_polls, move_polls=config.move_polls,
                                hold_polls=config.hold_polls, id=config.id or "person")
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """A LeRobot plugin package, installed as pip would (a dist-info beside the module), importable
    here and in every process the test starts."""
    where = tmp_path_factory.mktemp("plugin")
    (where / f"{PLUGIN}.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    info = where / f"{PLUGIN}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0.1\n")
    sys.path.insert(0, str(where))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")]))
    from lerobot.robots import Robot

    from embodyrl.hal.lerobot import make_robot

    made = make_robot({"type": "embodyrl_sim_follower", "calibration_dir": str(where / "calibration")})
    assert isinstance(made, Robot)  # LeRobot's own registry made it, from the plugin LeRobot found
    return where


def test_the_so101_file_is_read_by_lerobots_own_class_and_refused_without_bounds(tmp_path):
    from lerobot.robots.so_follower import SO101Follower

    loaded = robot.load(str(SO101))
    device, _ = loaded.make()
    try:
        assert isinstance(device.inner.robot, SO101Follower)
        kind = loaded.layout().kinds[0]
        assert kind.action_spec.names == ("shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos",
                                          "wrist_flex.pos", "wrist_roll.pos", "gripper.pos")
        assert kind.observation_spec["front"].shape == (480, 640, 3)
        assert kind.action_spec.maximum[-1] == 100.0
    finally:
        robot.release(device)
    assert loaded.teleop == "lerobot:so101_leader:port=/dev/ttyACM1,id=my_leader"
    data = yaml.safe_load(SO101.read_text())
    del data["device"]["bounds"]
    (tmp_path / "so101.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(robot.RobotFileError, match=r"needs bounds: .*shoulder_pan\.pos.*gripper\.pos"):
        robot.load(str(tmp_path / "so101.yaml")).layout()
    data["device"]["lerobot"]["type"] = "so101_folower"
    data["device"]["bounds"] = yaml.safe_load(SO101.read_text())["device"]["bounds"]
    (tmp_path / "so101.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(robot.RobotFileError, match=r"no robot type 'so101_folower'; known: .*so101_follower"):
        robot.load(str(tmp_path / "so101.yaml")).layout()


def _robot_file(directory: Path, device: dict) -> str:
    data = {"name": "lerobot_sim_arm", "device": device, "task": {"factory": "embodyrl.envs.lerobot_arm:pose_task"},
            "control": {"rate_hz": 50, "episode_steps": 100, "realtime": False}, "reset": "auto",
            "safety": {"max_delta": 4.0, "estop_after_faults": 3}}
    path = directory / f"{'server' if 'lerobot' in device else 'actor'}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_lerobots_classes_through_the_robot_server_recorded_trained_evaluated_exported(plugin, tmp_path):
    server_file = _robot_file(tmp_path, {
        "lerobot": {"type": "embodyrl_sim_follower", "id": "sim", "calibration_dir": str(tmp_path / "calibration")},
        "bounds": {n: list(b) for n, b in BOUNDS.items()}, "home": HOME, "home_s": 0.4})
    server, endpoint = served_with_keys(tmp_path, server_file)
    try:
        actor_file = _robot_file(tmp_path, {
            "endpoint": endpoint, "retries": 1,
            "keys": {"secret_key": "keys/actor/actor.key_secret", "server_key": "keys/robot/robot.key"}})
        teleop = "lerobot:embodyrl_scripted_leader:rest_polls=5,move_polls=20,hold_polls=100"
        proc = in_process("record", actor_file, "--teleop", teleop, "--episodes", "3", "--out", "demos", "--unpaced",
                          cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["successes"] == 3
        proc = in_process("train", actor_file, "--algorithm", "sac", "--demos", "demos", "--run-dir", "run",
                          "--steps", "3000", "--eval_episodes", "3", "--learner.min_replay", "200",
                          "--actor.random_steps", "300", "--teleop", teleop, "--actor.time_scale", "4", "--quiet",
                          cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["env_steps"] >= 3000 and summary["eval_episodes"] == 3
        actor = json.loads((tmp_path / "run" / "actor-0.jsonl").read_text().splitlines()[-1])
        assert 0 < actor["interventions"] < actor["env_steps"]  # the leader took over, and handed back
        proc = in_process("export", "run", "policy", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    finally:
        server.terminate()
        server.wait(30)
    assert server.returncode is not None
    from embodyrl.hal import runtime

    policy = runtime.load(tmp_path / "policy", seed=0)
    device, _ = robot.load(server_file).make()  # the exported policy on LeRobot's class in this process
    with device:
        action, _ = policy.act(device.reset(0), explore=False)
    assert action.shape == (len(NAMES),)
