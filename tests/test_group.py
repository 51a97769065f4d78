"""Device groups: a 7-DoF MuJoCo arm and a 2-DoF MuJoCo gripper, one actor, a real learner server."""

import time

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.drivers.mujoco import MujocoDevice
from embodyrl.hal.group import DeviceGroup
from embodyrl.hal.layout import DeviceKind, Layout
from embodyrl.hal.policy import UniformRandomPolicy
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.steps import Source
from embodyrl.hal.task import Task
from embodyrl.hal.testing import DeviceConformance
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.protocol import DeviceInfo
from embodyrl.learner.build import admission
from embodyrl.learner.testing import ServedLearner

GRIPPER_XML = """
<mujoco model="gripper">
  <option timestep="0.002"><flag contact="disable" gravity="disable"/></option>
  <worldbody>
    <body name="palm">
      <body name="left"><joint name="left" type="slide" axis="1 0 0" range="0 0.04"/>
        <geom type="box" size="0.01 0.01 0.03" mass="0.05"/></body>
      <body name="right"><joint name="right" type="slide" axis="-1 0 0" range="0 0.04"/>
        <geom type="box" size="0.01 0.01 0.03" mass="0.05"/></body>
    </body>
  </worldbody>
  <actuator>
    <position joint="left" kp="50" ctrlrange="0 0.04" ctrllimited="true"/>
    <position joint="right" kp="50" ctrlrange="0 0.04" ctrllimited="true"/>
  </actuator>
</mujoco>
"""


def make_group(device_ids=None):
    arm, _ = envs.make("arm_reach")
    gripper = MujocoDevice(GRIPPER_XML, control_substeps=10)
    return DeviceGroup({"arm": SafeDevice(arm, SafetyConfig(max_delta=5.0)),
                        "gripper": SafeDevice(gripper)}, device_ids=device_ids or {"arm": 3, "gripper": 7})


class GripperOpen(Task):
    name = "gripper_open"
    max_episode_steps = 30

    def reward(self, observation, action, next_observation):
        return float(next_observation["qpos"].sum())


class TestGroupConformance(DeviceConformance):
    @pytest.fixture
    def device(self):
        with make_group() as group:
            yield group


def test_group_specs_and_joint_action():
    group = make_group()
    assert group.action_spec.shape == (9,)
    assert {"arm/qpos", "arm/ee_pos", "gripper/qpos"} <= set(group.observation_spec)
    with group:
        group.reset(seed=0)
        action = np.concatenate([np.zeros(7), [0.04, 0.04]]).astype(np.float32)
        for _ in range(50):
            obs = group.step(action)
        assert obs["gripper/qpos"] == pytest.approx([0.04, 0.04], abs=0.005)
        assert group["gripper"].last_applied.tolist() == pytest.approx([0.04, 0.04])
        group["arm"].estop("arm fault")
        assert group.health().status == "faulted" and "arm" in group.health().reason
        group.estop("operator")
        assert group["gripper"].estopped
        group.clear_estop()
        assert not group["arm"].estopped and group.health().status == "ok"


def test_bad_groups_are_refused():
    arm, _ = envs.make("pendulum")
    with pytest.raises(ValueError, match="distinct"):
        DeviceGroup({"a": arm, "b": MujocoDevice(GRIPPER_XML)}, device_ids={"a": 1, "b": 1})
    with pytest.raises(ValueError, match="'/'"):
        DeviceGroup({"a/b": arm})


def test_a_heterogeneous_group_streams_correctly_tagged_steps_to_a_learner(tmp_path):
    group = make_group(device_ids={"arm": 0, "gripper": 1})  # the layout's ids: one per kind, in order
    infos = [DeviceInfo(m.device_id, m.name, m.device.observation_spec, m.device.action_spec)
             for m in group.members]
    layout = Layout(tuple(DeviceKind(m.name, m.device.observation_spec, m.device.action_spec)
                          for m in group.members))
    declared = []
    admit = admission(layout)
    learner = ServedLearner(tmp_path, layout, run_id="group-test", incarnation=99, peer_timeout_s=20,
                            admit=lambda devices: declared.extend(devices) or admit(devices))
    link = LearnerLink(learner.endpoint, actor_name="group", actor_id=5, devices=infos,
                       handshake_timeout_s=20, peer_timeout_s=20)
    arm_task = envs.make("arm_reach")[1]
    policies = {m.name: UniformRandomPolicy(m.device.action_spec, seed=1) for m in group.members}
    with learner:
        with group, link:
            loop = ActorLoop(group, {"arm": arm_task, "gripper": GripperOpen()}, policies,
                             link, ActorConfig(actor_id=5, send_every=16, random_steps=0))
            stats = loop.run(max_steps=70)
            deadline = time.monotonic() + 20
            while link.unacked_rows and time.monotonic() < deadline:
                link.poll(20)
        stored = learner.read(lambda service: service.data.replay.size)
    assert [d.device_id for d in declared] == [0, 1]
    assert stats.env_steps == 140 and stats.episodes == 2  # the gripper's episodes: 30 steps
    by_device = {0: [], 1: []}
    for b in learner.taken:
        assert (b.steps.device_id == b.device_id).all() and (b.steps.actor_id == 5).all()
        by_device[b.device_id].append(b.steps)
    arm_rows = sum(s.env_steps for s in by_device[0])
    gripper_rows = sum(s.env_steps for s in by_device[1])
    assert arm_rows == 70 and gripper_rows == 70
    for s in by_device[0]:
        assert s.action.shape[1:] == (7,) and s.observation["ee_pos"].shape[1:] == (3,)
    for s in by_device[1]:
        assert s.action.shape[1:] == (2,) and set(s.observation) == {"qpos", "qvel"}
        assert (s.source == Source.ONLINE).all()
    assert sum(s.final.sum() for s in by_device[1]) == 2
    assert stored == sum(len(t.steps) for t in learner.taken)  # the replay holds every row it acked
