"""End-effector moves over a joint-space arm: IK on the reach arm's model, the device layer (torque
PD or the arm's own position control, a gripper), the robot file's ``end_effector:``, a person at
the keyboard and a scripted person steering the hand."""

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_helpers import in_process

from embodyrl import envs, robot
from embodyrl.envs.arm import ASSET, END_EFFECTOR, arm_model, expert
from embodyrl.hal.drivers.mujoco import MujocoDevice
from embodyrl.hal.end_effector import EndEffectorConfig, EndEffectorDevice
from embodyrl.hal.kinematics import ArmModel
from embodyrl.hal.steps import OBSERVATION_PREFIX as OBS
from embodyrl.hal.teleop import make_source
from embodyrl.hal.testing import DeviceConformance
from embodyrl.robot import RobotFileError

ROBOTS = Path(__file__).resolve().parents[1] / "examples" / "robots"


@pytest.fixture(scope="module")
def arm():
    return arm_model()


def reachable(arm, rng, n):
    """Joint positions inside the limits (away from them by 10% of the range) and their hand poses."""
    span = arm.upper - arm.lower
    qs = rng.uniform(arm.lower + 0.1 * span, arm.upper - 0.1 * span, (n, arm.dof))
    return qs, [arm.forward(q) for q in qs]


def test_ik_puts_the_hand_on_reachable_points_within_the_joint_limits(arm):
    rng = np.random.default_rng(0)
    qs, poses = reachable(arm, rng, 200)
    near = []  # a controller's solve: 2 cm from where the hand is
    for q, (position, _) in zip(qs, poses, strict=True):
        move = rng.normal(size=3)
        result = arm.solve(q, position + 0.02 * move / np.linalg.norm(move))
        assert (result.q >= arm.lower).all() and (result.q <= arm.upper).all()
        if not result.converged:  # only where the arm is near-straight: the move leaves its reach
            assert np.linalg.svd(arm.jacobian(q)[0], compute_uv=False).min() < 0.06
        near.append(result)
    errors = np.array([r.position_error_m for r in near])
    assert np.mean([r.converged for r in near]) >= 0.95 and np.percentile(errors, 95) < 1e-4, np.percentile(errors, 95)
    far = [arm.solve(arm.rest, position, iterations=100) for position, _ in poses[:100]]  # from the rest posture
    assert np.mean([r.converged for r in far]) >= 0.8
    posed = [arm.solve(arm.rest, position, rotation, iterations=200) for position, rotation in poses[:50]]
    good = [r for r in posed if r.converged]
    assert len(good) >= 0.6 * len(posed) and max(r.orientation_error_rad for r in good) <= 1e-3


def test_ik_of_an_unreachable_point_stops_at_the_limits_and_says_how_far(arm):
    result = arm.solve(arm.rest, np.array([3.0, 0.0, 0.5]))  # two arm lengths away
    assert not result.converged and result.position_error_m > 1.5
    assert (result.q >= arm.lower).all() and (result.q <= arm.upper).all()
    with pytest.raises(ValueError, match="'j9'"):
        ArmModel(ASSET, "ee", limits={"j9": (0, 1)})
    with pytest.raises(ValueError, match="site 'hand' is not in the model; it has ee, target"):
        ArmModel(ASSET, "hand")


class TestEndEffectorArmConformance(DeviceConformance):
    @pytest.fixture
    def device(self):
        with envs.make("arm_reach_ee")[0] as device:
            yield device


def test_the_reach_arm_in_end_effector_moves_holds_the_rate_and_the_box():
    device, _ = envs.make("arm_reach_ee")
    assert device.action_spec.shape == (3,) and device.control_period_s == pytest.approx(0.02)
    with device:
        observation = device.reset(1)
        for _ in range(60):  # lean toward a comfortable pose first
            observation = device.step(expert({**observation, "target_pos": np.array([0.45, 0.0, 0.6])}))
        start = observation["ee_pos"].copy()
        observation = device.step(np.array([1.0, 0.0, 0.0], np.float32))
        for _ in range(9):
            commanded = device.last_target[0]
            observation = device.step(np.array([1.0, 0.0, 0.0], np.float32))
            assert commanded - observation["ee_pos"][0] <= END_EFFECTOR["max_step_m"] + 1e-6  # never ahead by more
        moved = observation["ee_pos"] - start
        assert 0.04 < moved[0] <= 10 * END_EFFECTOR["max_step_m"] and np.abs(moved[1:]).max() < 0.03, moved
        for _ in range(60):  # push up and out: the command stops at the box
            device.step(np.array([1.0, 0.0, 1.0], np.float32))
            assert (device.last_target <= np.asarray(END_EFFECTOR["workspace_high"]) + 1e-9).all()
        held = device.step(device.safe_action)["ee_pos"]
        for _ in range(25):  # zero holds the hand still (gravity compensated)
            observation = device.step(device.safe_action)
        assert np.linalg.norm(observation["ee_pos"] - held) < 0.02


POSITION_ARM = ASSET.read_text().replace('<motor name="j', '<position kp="400" kv="40" name="j').replace(
    'ctrlrange="-80 80"', 'ctrlrange="-2.9 2.9"').replace('ctrlrange="-60 60"', 'ctrlrange="-2.9 2.9"').replace(
    'ctrlrange="-20 20"', 'ctrlrange="-2.9 2.9"').replace('ctrlrange="-10 10"', 'ctrlrange="-2.9 2.9"').replace(
    '<site name="ee"', '<body name="finger"><joint name="finger" type="slide" axis="1 0 0" range="0 0.04" '
    'damping="1"/><geom type="sphere" size="0.01" mass="0.05" contype="0" conaffinity="0"/></body><site name="ee"').replace(
    "</actuator>", '<position name="finger" joint="finger" kp="50" ctrlrange="0 0.04"/></actuator>').replace(
    'integrator="implicitfast"', 'integrator="implicitfast" gravity="0 0 0"')
"""The reach arm with joint position actuators and a gripper: an arm running its own joint controller
(which, as real ones do, compensates gravity: here there is none)."""


def test_an_arm_with_its_own_joint_control_gets_joint_targets_and_its_gripper_a_position(tmp_path):
    model = tmp_path / "arm_position.xml"
    model.write_text(POSITION_ARM)
    inner = MujocoDevice(model, control_substeps=10)
    config = EndEffectorConfig(model=model, site="ee", workspace_low=(-1, -1, 0), workspace_high=(1, 1, 1.5),
                               command="position", gripper=7, joints=tuple(f"j{i}" for i in range(1, 8)),
                               rest=END_EFFECTOR["rest"], joint_limits=END_EFFECTOR["joint_limits"])
    with EndEffectorDevice(inner, config) as device:
        assert device.action_spec.shape == (4,)
        observation = device.reset(0)
        target = np.array([0.45, 0.1, 0.5])
        for _ in range(250):
            observation = device.step(np.append(expert({**observation, "target_pos": target}), 1.0))
        assert observation["qpos"][-1] == pytest.approx(0.04, abs=0.005)  # the finger open
        assert np.linalg.norm(observation["ee_pos"] - target) < 0.02  # the hand where it was steered
        observation = device.step(np.array([0.0, 0.0, 0.0, -1.0], np.float32))
        assert inner.data.ctrl[-1] == 0.0  # closed: the bottom of its range


def test_a_person_at_the_keyboard_moves_the_hand_not_a_joint():
    device, _ = envs.make("arm_reach_ee")
    read, write = os.pipe()
    keys = make_source("keyboard", device.action_spec, fd=read)
    try:
        with device:
            observation = device.reset(2)
            for _ in range(60):
                observation = device.step(expert({**observation, "target_pos": np.array([0.3, 0.0, 0.7])}))
            start = observation["ee_pos"].copy()
            for _ in range(25):
                os.write(write, b"3")  # element 2, z, up by half its range
                deadline = time.monotonic() + 5
                while (action := keys.poll(observation)) is None and time.monotonic() < deadline:
                    time.sleep(0.005)
                np.testing.assert_allclose(action, [0.0, 0.0, 0.5])
                observation = device.step(action)
        moved = observation["ee_pos"] - start
        assert moved[2] > 0.05 and np.abs(moved[:2]).max() < 0.03, moved  # up (1.5 cm a press at most), not sideways
    finally:
        keys.close()
        os.close(write)


@pytest.mark.parametrize(("task", "expert_name", "width"), [("arm_reach_ee", "expert", 3), ("arm_reach", "joint_expert", 7)])
def test_a_scripted_person_steers_the_hand_to_every_target(tmp_path, task, expert_name, width):
    """The reach's scripted experts, moving the hand or the joints, as ``embodyrl record`` drives them."""
    out = tmp_path / "demos"
    done = in_process("record", task, "--teleop", f"script:embodyrl.envs.arm:{expert_name}", "--episodes", "5",
                      "--out", str(out), "--unpaced")
    assert done.returncode == 0, done.stderr
    summary = in_process("demos", str(out), "--json")
    assert json.loads(summary.stdout)["success_rate"] == 1.0  # the task's own success: within 5 cm at the end
    for path in sorted(out.glob("*.npz")):
        with np.load(path, allow_pickle=False) as data:
            assert data["action"].shape[1] == width
            final = data[OBS + "ee_pos"][-1] - data[OBS + "target_pos"][-1]
            assert np.linalg.norm(final) < 0.05


def test_the_robot_file_declares_the_builtin_arm():
    file_device, _ = robot.load(str(ROBOTS / "arm_ee.yaml")).make()
    builtin, _ = envs.make("arm_reach_ee")
    actions = np.random.default_rng(0).uniform(-1, 1, (20, 3)).astype(np.float32)
    with file_device, builtin:
        a, b = file_device.reset(4), builtin.reset(4)
        for action in actions:
            a, b = file_device.inner.step(action), builtin.step(action)  # under the file's safety layer
        for name in b:
            np.testing.assert_allclose(a[name], b[name], err_msg=name)


@pytest.mark.parametrize(("change", "message"), [
    ({"joint_limits": {"j9": [0, 1]}}, "end_effector: joint limit for 'j9'"),
    ({"workspace": {"low": [0, 0], "high": [1, 1, 1]}}, "end_effector.workspace: low and high are three numbers"),
    ({"command": "velocity"}, "end_effector.command: expected torque"),
    ({"pd": {"kp": 100, "ki": 1}}, "end_effector.pd.ki: unknown field"),
    ({"site": "hand"}, "end_effector: site 'hand' is not in the model"),
    ({"model": "missing.xml"}, "end_effector.model: no file"),
    ({"model": "embodyrl.envs:assets/nope.xml"}, "end_effector.model: no file 'assets/nope.xml' in package embodyrl.envs"),
])
def test_a_wrong_end_effector_section_is_refused_by_field(tmp_path, change, message):
    data = yaml.safe_load((ROBOTS / "arm_ee.yaml").read_text())
    data["end_effector"].update(change)
    path = tmp_path / "arm_ee.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RobotFileError, match=message):
        robot.load(str(path)).layout()


def test_the_quick_experiment_writes_every_key_keeps_its_runs_and_resumes_without_redoing_work(tmp_path):
    """``examples/ee_reach.py --quick``: every variant through ``embodyrl train`` and evaluation, tiny."""
    import subprocess
    import sys

    from embodyrl.runlog import has_artifacts

    command = [sys.executable, str(ROBOTS.parent / "ee_reach.py"), "--out", str(tmp_path / "out"), "--quick",
               "--keep", str(tmp_path / "kept")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(result["variants"]) == {"joint", "end_effector", "end_effector_crossq"} and result["wall_s"] > 0
    for variant in result["variants"].values():
        assert len(variant["steps"]) == 1 and variant["steps"][0] >= 400
        for key in ("success_rate", "final_distance"):
            assert len(variant[key]) == 1 and set(variant[f"{key}_by_seed"]) == {"0"}
        assert 0.0 <= variant["success_rate"][0] <= 1.0 and variant["final_distance"][0] > 0
    for name in ("plan.json", "results.json", "progress/joint-s0.json", "progress/end_effector-s0.json"):
        assert (tmp_path / "kept" / name).is_file(), name
    assert (tmp_path / "kept.png").is_file()
    kept_runs = ("joint-s0", "end_effector-s0", "end_effector_crossq-s0")
    assert all(has_artifacts(tmp_path / "kept" / "runs" / run) for run in kept_runs)
    crossq = json.loads((tmp_path / "out" / "runs" / "end_effector_crossq-s0" / "config.json").read_text())
    assert crossq["algorithm"] == "crossq" and crossq["task"] == "arm_reach_ee"
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "success" not in again.stdout.split("{")[0]  # nothing trained again
