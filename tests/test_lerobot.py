"""LeRobot's robots and teleoperators under embodyrl, through classes with LeRobot's methods (the
simulated follower arm and a scripted leader of :mod:`embodyrl.envs.lerobot_arm`); the same with
LeRobot's own classes is ``test_lerobot_real.py`` (slow, where LeRobot is installed)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from embodyrl import robot
from embodyrl.envs.lerobot_arm import BOUNDS, GOAL, HOME, NAMES, ScriptedLeader, SimulatedFollower
from embodyrl.hal.drivers.lerobot import LeRobotDevice, wrap
from embodyrl.hal.intervention import EpisodeAborted
from embodyrl.hal.lerobot import LeRobotError
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.specs import ArraySpec, SpecError
from embodyrl.hal.teleop import TeleopError, check_spec, make_source
from embodyrl.hal.teleop_lerobot import LeRobotTeleop, parse, spec_of
from tests.cli_helpers import in_process
from tests.robot_helpers import served_with_keys

ROOT = Path(__file__).resolve().parent.parent
SIM_ARM = ROOT / "examples" / "robots" / "lerobot_sim_arm.yaml"
SO101 = ROOT / "examples" / "robots" / "so101.yaml"
GOAL_ACTION = np.array([GOAL[n] for n in NAMES], np.float32)


def device(**options) -> LeRobotDevice:
    arm = options.pop("arm", None) or SimulatedFollower(**options.pop("arm_options", {}))
    return LeRobotDevice(arm, BOUNDS, control_period_s=0.02, realtime=False, **options)


# -- specs from LeRobot's features ------------------------------------------------------------
def test_the_specs_are_lerobots_features_with_the_declared_bounds_and_names():
    d = device(arm_options={"cameras": {"front": {"width": 16, "height": 12}}})
    state, front = d.observation_spec["state"], d.observation_spec["front"]
    assert state.names == NAMES and state.dtype == np.float32
    assert front.shape == (12, 16, 3) and front.dtype == np.uint8
    assert d.action_spec.names == NAMES
    assert d.action_spec.minimum.tolist() == [BOUNDS[n][0] for n in NAMES]
    assert d.action_spec.maximum.tolist() == [BOUNDS[n][1] for n in NAMES]
    assert not d.robot.is_connected  # the specs need no hardware
    with d:
        observation = d.reset(0)
        assert observation["front"].shape == (12, 16, 3) and observation["front"].any()
        np.testing.assert_allclose(observation["state"], [HOME[n] for n in NAMES], atol=1e-3)


def test_names_travel_in_a_spec_message_and_bad_ones_are_refused():
    spec = ArraySpec("action", (2,), np.float32, -1, 1, ("a.pos", "b.pos"))
    again = ArraySpec.from_msg(spec.to_msg())
    assert again == spec and again.names == ("a.pos", "b.pos")
    assert "names" not in ArraySpec("x", (2,), np.float32).to_msg()  # unnamed specs travel as before
    for names, message in ((("a",), "1 element names for shape"), (("a", "a"), "distinct"), (("a", ""), "distinct")):
        with pytest.raises(SpecError, match=message):
            ArraySpec("action", (2,), np.float32, names=names)
    with pytest.raises(SpecError, match="list of strings"):
        ArraySpec.from_msg({**spec.to_msg(), "names": [1, 2]})


def test_a_lerobot_robot_without_bounds_is_refused_naming_every_action_feature():
    with pytest.raises(LeRobotError, match="needs bounds: .*" + ", ".join(NAMES).replace(".", r"\.")):
        wrap(SimulatedFollower(), None)
    partial = dict(list(BOUNDS.items())[:5])
    with pytest.raises(LeRobotError, match=r"missing for j6\.pos, j7\.pos"):
        LeRobotDevice(SimulatedFollower(), partial)
    with pytest.raises(LeRobotError, match=r"elbow\.pos are not action features"):
        LeRobotDevice(SimulatedFollower(), {**BOUNDS, "elbow.pos": (0, 1)})
    with pytest.raises(LeRobotError, match=r"bounds\.j1\.pos: expected \[low, high\]"):
        LeRobotDevice(SimulatedFollower(), {**BOUNDS, "j1.pos": (5, -5)})
    with pytest.raises(LeRobotError, match="lacks LeRobot's Robot methods"):
        LeRobotDevice(object(), BOUNDS)


# -- the arm held where it is -----------------------------------------------------------------
def test_the_safe_action_holds_the_arm_where_it_is_not_at_zero():
    safe = SafeDevice(device(home=HOME, home_s=0.1), SafetyConfig(max_delta=4.0))
    assert safe.holds_in_place and safe.safe_action is None  # never observed: nothing to hold
    with safe:
        safe.reset(0)
        for _ in range(30):
            observation = safe.step(GOAL_ACTION)
        held = safe.safe_action
        np.testing.assert_allclose(held, observation["state"], atol=1e-4)
        assert np.abs(held).max() > 20  # the goal pose, far from zero
        for _ in range(20):
            after = safe.step(safe.safe_action)  # the watchdog's and the operator's hold
        np.testing.assert_allclose(after["state"], observation["state"], atol=0.5)


def test_an_estop_commands_the_hold_and_latches():
    d = device()
    with d:
        d.reset(0)
        for _ in range(10):
            observation = d.step(GOAL_ACTION)
        sent = d.robot.sent
        d.estop("test")
        assert d.robot.sent == sent + 1  # one command: hold
        np.testing.assert_allclose([d.sent[n] for n in NAMES], observation["state"], atol=1e-4)
        with pytest.raises(Exception, match="e-stopped"):
            d.step(GOAL_ACTION)


class _CameraFails(SimulatedFollower):
    def connect(self, calibrate=True):
        super().connect(calibrate)
        raise OSError("camera 0 did not open")


class _NotCalibrated(SimulatedFollower):
    calibrate_asked = None

    def connect(self, calibrate=True):
        type(self).calibrate_asked = calibrate
        super().connect(calibrate)

    @property
    def is_calibrated(self):
        return False


def test_disconnect_on_every_way_out_and_calibration_is_left_to_lerobot():
    d = device()
    with d:
        d.reset(0)
    assert not d.robot.is_connected
    failing = device(arm=_CameraFails())
    with pytest.raises(OSError, match="camera 0"):
        failing.connect()
    assert not failing.robot.is_connected  # the bus a failed connect opened is closed again
    uncalibrated = device(arm=_NotCalibrated())
    with pytest.raises(LeRobotError, match="not calibrated.*lerobot-calibrate"):
        uncalibrated.connect()
    assert _NotCalibrated.calibrate_asked is False and not uncalibrated.robot.is_connected


def test_realtime_steps_return_one_control_period_after_the_send():
    d = LeRobotDevice(SimulatedFollower(), BOUNDS, control_period_s=0.05, realtime=True)
    with d:
        d.reset(0)
        started = time.monotonic()
        for _ in range(4):
            d.step(GOAL_ACTION)
        assert time.monotonic() - started >= 4 * 0.05


# -- the person's leader arm ------------------------------------------------------------------
def test_a_teleoperators_action_is_mapped_by_name_and_refused_where_it_does_not_fit():
    spec = device().action_spec
    reversed_spec = ArraySpec("action", (7,), np.float32, -200, 200, tuple(reversed(NAMES)))
    leader = ScriptedLeader(rest_polls=0, move_polls=1)
    source = LeRobotTeleop(leader, reversed_spec, release_s=10)
    source.poll()
    action = source.poll()  # moved: the person has control
    np.testing.assert_allclose(action, [GOAL[n] for n in reversed(NAMES)])
    short = ArraySpec("action", (8,), np.float32, -1, 1, (*NAMES, "gripper.pos"))
    with pytest.raises(SpecError, match=r"the device's gripper\.pos not given"):
        LeRobotTeleop(ScriptedLeader(), short)
    fewer = ArraySpec("action", (6,), np.float32, -1, 1, NAMES[:6])
    with pytest.raises(SpecError, match=r"j7\.pos not the device's"):
        LeRobotTeleop(ScriptedLeader(), fewer)
    with pytest.raises(SpecError, match="have none"):
        LeRobotTeleop(ScriptedLeader(), ArraySpec("action", (7,), np.float32, -1, 1))
    assert spec.names == NAMES


def test_a_leader_arm_has_control_while_it_moves_and_hands_back_once_still():
    spec = device().action_spec
    source = LeRobotTeleop(ScriptedLeader(rest_polls=3, move_polls=5, hold_polls=1000), spec, release_s=0.2)
    polls = [source.poll() for _ in range(10)]
    assert all(p is None for p in polls[:4])  # at rest: the policy acts
    assert all(p is not None for p in polls[4:])  # moving, then just still: the person has it
    time.sleep(0.25)
    assert source.poll() is None  # still for release_s: back to the policy
    source.close()
    assert not source.teleop.is_connected


class _GamepadLike(ScriptedLeader):
    """A teleoperator that says itself when the person intervenes (LeRobot's gamepad, keyboard)."""

    events: dict = {}

    def get_teleop_events(self):
        return self.events


def test_a_teleoperator_with_events_says_itself_when_the_person_has_control():
    spec = device().action_spec
    pad = _GamepadLike(rest_polls=0, move_polls=1)
    source = LeRobotTeleop(pad, spec)
    pad.events = {"is_intervention": False}
    assert source.poll() is None
    pad.events = {"is_intervention": True}
    np.testing.assert_allclose(source.poll(), GOAL_ACTION)
    pad.events = {"rerecord_episode": True, "is_intervention": True}
    with pytest.raises(EpisodeAborted, match="re-record"):
        source.poll()


def test_teleop_names_parse_and_refuse():
    assert parse("lerobot:so101_leader:port=/dev/ttyACM1,id=me,use_degrees=true") == {
        "type": "so101_leader", "port": "/dev/ttyACM1", "id": "me", "use_degrees": True}
    assert spec_of({"type": "so101_leader", "port": "/dev/ttyACM1", "id": "me"}) == \
        "lerobot:so101_leader:port=/dev/ttyACM1,id=me"
    check_spec("lerobot:embodyrl.envs.lerobot_arm.leader:rest_polls=2")
    for bad in ("lerobot:", "lerobot:so101_leader:port"):
        with pytest.raises(TeleopError):
            check_spec(bad)
    with pytest.raises(TeleopError, match="cannot import"):
        make_source("lerobot:nowhere.leader", device().action_spec)
    source = make_source("lerobot:embodyrl.envs.lerobot_arm.leader:rest_polls=0,move_polls=1",
                         device().action_spec)
    assert source.teleop.is_connected and source.teleop.rest_polls == 0
    source.close()


# -- robot files ------------------------------------------------------------------------------
def _sim_arm(**changes) -> dict:
    data = yaml.safe_load(SIM_ARM.read_text())
    for key, value in changes.items():
        section, _, field = key.partition(".")
        if value is None:
            del data[section][field]
        else:
            data[section][field] = value
    return data


def _write(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_the_shipped_sim_arm_file_declares_bounds_and_is_refused_without_them(tmp_path):
    layout = robot.load(str(SIM_ARM)).layout()
    assert layout.kinds[0].action_spec.names == NAMES
    with pytest.raises(robot.RobotFileError, match=r"lerobot_sim_arm.yaml: device: a LeRobot robot needs bounds"):
        robot.load(_write(tmp_path / "lerobot_sim_arm.yaml", _sim_arm(**{"device.bounds": None}))).layout()
    with pytest.raises(robot.RobotFileError, match=r"device\.bounds\.j1\.pos: expected \[low, high\]"):
        robot.load(_write(tmp_path / "a.yaml", _sim_arm(**{"device.bounds": {**BOUNDS, "j1.pos": [1]}})))
    data = _sim_arm()
    data["device"] = {"endpoint": "tcp://127.0.0.1:5", "bounds": BOUNDS}
    with pytest.raises(robot.RobotFileError, match=r"device\.bounds: belongs to a LeRobot robot"):
        robot.load(_write(tmp_path / "b.yaml", data))
    data["device"] = {"factory": "embodyrl.envs.arm:make_device", "bounds": BOUNDS}
    with pytest.raises(robot.RobotFileError, match=r"returned a Device, which declares its own bounds"):
        robot.load(_write(tmp_path / "c.yaml", data)).layout()
    del data["control"]["rate_hz"]
    data["device"] = _sim_arm()["device"]
    with pytest.raises(robot.RobotFileError, match=r"control\.rate_hz: missing"):
        robot.load(_write(tmp_path / "d.yaml", data)).layout()


def test_a_lerobot_type_needs_lerobot_and_says_how_to_get_it(tmp_path):
    pytest.importorskip("yaml")
    try:
        import lerobot  # noqa: F401
        pytest.skip("LeRobot is installed here: test_lerobot_real.py covers its types")
    except ImportError:
        pass
    with pytest.raises(robot.RobotFileError, match=r"LeRobot is not installed.*embodyrl\[lerobot\]"):
        robot.load(str(SO101)).layout()


def test_a_file_names_the_persons_teleoperator_and_a_person_judged_task(tmp_path):
    data = _sim_arm()
    data["teleop"] = {"lerobot": {"type": "embodyrl.envs.lerobot_arm.leader", "rest_polls": 2}}
    data["task"] = {"reward": "person"}
    data["reset"] = "operator"
    loaded = robot.load(_write(tmp_path / "arm.yaml", data))
    assert loaded.teleop == "lerobot:embodyrl.envs.lerobot_arm.leader:rest_polls=2"
    assert loaded.config_defaults()["actor"]["teleop"] == loaded.teleop
    _, task = loaded.make()
    assert task.reward({}, None, {}) == 0.0 and task.success_reward == 1.0
    data["reset"] = "auto"
    with pytest.raises(robot.RobotFileError, match="task.reward: person: .*reset: operator"):
        robot.load(_write(tmp_path / "arm2.yaml", data))
    data["teleop"] = "lerobot:"
    with pytest.raises(robot.RobotFileError, match="teleop: "):
        robot.load(_write(tmp_path / "arm3.yaml", data))


# -- through the robot server: recorded, trained, evaluated, exported ----------------------------
def _remote(directory: Path, endpoint: str) -> str:
    """The actor's side: the same robot, reached through the robot server with keys."""
    data = yaml.safe_load(SIM_ARM.read_text())
    data["device"] = {"endpoint": endpoint, "retries": 1,
                      "keys": {"secret_key": "keys/actor/actor.key_secret", "server_key": "keys/robot/robot.key"}}
    return _write(directory / "arm.yaml", data)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The sim arm's robot file served by a robot server process, and the actor's robot file."""
    home = tmp_path_factory.mktemp("lerobot")
    server, endpoint = served_with_keys(home, str(SIM_ARM))
    try:
        yield home, _remote(home, endpoint)
    finally:
        server.terminate()
        server.wait(30)


def test_record_train_eval_and_export_through_the_robot_server(served):
    home, arm = served
    teleop = "lerobot:embodyrl.envs.lerobot_arm.leader:rest_polls=5,move_polls=20,hold_polls=100"
    proc = in_process("record", arm, "--teleop", teleop, "--episodes", "2", "--out", "demos", "--unpaced", cwd=home)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["episodes"] == 2 and summary["successes"] == 2  # the leader brought the arm to the goal
    first = int(re.search(r"episode-00000\.npz: .* the person commanded (\d+) steps", proc.stderr).group(1))
    assert 90 <= first < 100  # the leader is still for its first polls: the arm is held in place
    from embodyrl.hal.demos import read_specs

    observation_spec, action_spec = read_specs(home / "demos" / "episode-00000.npz")
    assert action_spec.names == NAMES and observation_spec["state"].names == NAMES
    proc = in_process("train", arm, "--algorithm", "sac", "--demos", "demos", "--run-dir", "run", "--steps", "1500",
                      "--eval_episodes", "2", "--sac.hidden_sizes", "[32, 32]", "--learner.min_replay", "200",
                      "--actor.random_steps", "200", "--quiet", cwd=home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((home / "run" / "summary.json").read_text())
    assert summary["env_steps"] >= 1500 and summary["eval_episodes"] == 2
    assert "eval_final_error_deg" in summary
    proc = in_process("export", "run", "policy", cwd=home)
    assert proc.returncode == 0, proc.stderr
    from embodyrl.hal import runtime

    policy = runtime.load(home / "policy", seed=0)
    local = SafeDevice(device(home=HOME, home_s=0.1))  # the exported policy on the arm in this process
    with local:
        action, _ = policy.act(local.reset(0), explore=False)
    assert action.shape == (7,) and local.action_spec.minimum.min() <= action.min()


def test_the_robot_server_serves_a_robot_file_only_with_its_bounds(tmp_path, capsys):
    from embodyrl.hal import robot_server

    unbounded = _write(tmp_path / "arm.yaml", _sim_arm(**{"device.bounds": None}))
    proc = in_process("robot-server", unbounded, "--bind", "tcp://127.0.0.1:0")
    assert proc.returncode == 2 and "device: a LeRobot robot needs bounds" in proc.stderr, proc.stderr
    assert robot_server.main([str(SIM_ARM)]) == 2
    assert "served by: embodyrl robot-server" in capsys.readouterr().err


def test_a_factory_returning_a_bare_lerobot_robot_is_refused_by_the_robot_server(capsys):
    from embodyrl.hal import robot_server

    assert robot_server.main(["embodyrl.envs.lerobot_arm:follower"]) == 2
    assert "A LeRobot robot needs its bounds" in capsys.readouterr().err


def test_a_remote_actor_holds_the_arm_as_its_robot_server_does():
    import threading

    from embodyrl.hal.drivers.remote import RemoteDevice
    from embodyrl.hal.robot_server import DeviceDriver, RobotServer

    driver = DeviceDriver(robot.load_device(str(SIM_ARM)))
    assert driver.holds_in_place and driver.safe_action() is None  # never observed: nothing to hold
    server, stop = RobotServer(driver, watchdog_s=60), threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        link = RemoteDevice(server.endpoint)
        link.connect()  # the specs come from the server, as a robot file's remote device is made
        remote = SafeDevice(link)
        with remote:
            assert remote.holds_in_place
            remote.reset(0)
            for _ in range(15):
                observation = remote.step(GOAL_ACTION)
            np.testing.assert_allclose(remote.safe_action, observation["state"], atol=1e-4)
            np.testing.assert_allclose(driver.safe_action(), observation["state"], atol=1e-4)
    finally:
        stop.set()
        thread.join(10)
        server.close()
