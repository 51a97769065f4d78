"""Where a reward bound comes from: a robot file's ``task.reward_bound``, a built-in task's own, else
1e6; recorded with the run; and the learner's server refuses a row beyond its device kind's bound."""

from types import SimpleNamespace

import numpy as np
import pytest
import yaml
import zmq

from embodyrl import envs, robot
from embodyrl.hal.steps import NO_POLICY, REWARD_BOUND, StepRecorder
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.codec import PROTOCOL_VERSION, decode, encode
from embodyrl.learner.build import reward_bound_of
from embodyrl.learner.testing import ServedLearner

ARM = {"name": "arm", "device": {"factory": "embodyrl.envs.arm:make_device"},
       "task": {"reward": {"terms": [{"name": "distance", "weight": -1.0, "distance": ["ee_pos", "target_pos"]}]},
                "reward_bound": 5},
       "control": {"episode_steps": 50, "realtime": False}}


def test_a_robot_file_declares_its_reward_bound_and_the_run_records_it(tmp_path):
    path = tmp_path / "arm.yaml"
    path.write_text(yaml.safe_dump(ARM))
    loaded = robot.load(str(path))
    assert loaded.reward_bounds() == (5.0,)
    record = loaded.record()
    assert record["layout"][0]["reward_bound"] == 5.0
    assert robot.reward_bounds_of(SimpleNamespace(task=str(path), robot=record)) == (5.0,)
    del record["layout"][0]["reward_bound"]  # a run recorded before bounds were
    assert robot.reward_bounds_of(SimpleNamespace(task=str(path), robot=record)) == (REWARD_BOUND,)
    path.write_text(yaml.safe_dump({**ARM, "task": {**ARM["task"], "reward_bound": -1}}))
    with pytest.raises(robot.RobotFileError, match="task.reward_bound: must be > 0"):
        robot.load(str(path))


def test_built_in_tasks_declare_theirs_and_others_take_the_default():
    assert robot.reward_bounds_of(SimpleNamespace(task="pendulum+arm_reach", robot={})) == (1e5, 100.0)
    assert envs.reward_bound("arm_push") == 10.0 and envs.reward_bound("halfcheetah") == REWARD_BOUND
    assert robot.reward_bounds_of(SimpleNamespace(task="robot_helpers:pendulum", robot={})) == (REWARD_BOUND,)


def test_the_server_refuses_a_reward_beyond_its_device_kinds_bound(tmp_path):
    layout = envs.layout("pendulum")
    learner = ServedLearner(tmp_path / "learner", layout, run_id="r", incarnation=2,
                            reward_bound=reward_bound_of(layout, (5.0,)))
    device, _ = envs.make("pendulum")
    info = P.DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    with device:
        obs = device.reset(seed=0)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(learner.endpoint)
    try:
        sock.send_multipart(encode(P.HELLO, {"actor": "a", "actor_id": 1, "devices": [info.to_msg()],
                                             "held": [0, -1], "protocol": PROTOCOL_VERSION},
                                   protocol=P.HELLO_PROTOCOL))
        assert sock.poll(10_000) and decode(sock.recv_multipart()).kind == P.WELCOME
        for seq, reward in enumerate([-6.0, -4.0], 1):
            rec = StepRecorder(device.observation_spec, device.action_spec, actor_id=1, device_id=0)
            for _ in range(3):
                rec.add(obs, np.zeros(1, np.float32), np.zeros(1, np.float32), reward, False, False, NO_POLICY)
            sock.send_multipart(encode(P.STEPS, {"seq": seq, "device_id": 0, "held": [0, -1]}, rec.flush().arrays()))
        assert learner.wait(lambda s: s.data.committed_seq(1) == 2)
        said = learner.read(lambda s: s.server.stats.last_refusal["steps_invalid"])
    finally:
        sock.close(0)
        learner.close()
    assert [t.seq for t in learner.taken] == [2]
    assert said == "reward: row 0 holds -6, beyond the bound |reward| <= 5"
