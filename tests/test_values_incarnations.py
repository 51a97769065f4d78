"""Rows name the policy that acted them: this learner's, an earlier learner of its run (a restart:
actors act under the old weights until the new ones arrive), or none. Any other incarnation is refused."""

import dataclasses
import json

import numpy as np
import zmq

from embodyrl import envs
from embodyrl.config import LearnerConfig, TrainConfig
from embodyrl.hal.steps import PolicyVersion, StepRecorder
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.codec import PROTOCOL_VERSION, decode, encode
from embodyrl.learner import build_learner
from embodyrl.learner.checkpoint import INCARNATIONS, record_incarnation
from embodyrl.learner.testing import ServedLearner


def test_a_run_directory_keeps_every_incarnation_in_start_order(tmp_path):
    assert record_incarnation(tmp_path, 11) == ()
    assert record_incarnation(tmp_path, 22) == (11,)
    assert record_incarnation(tmp_path, 33, earlier=(7,)) == (7, 11, 22)  # a checkpoint's, from before the list
    assert json.loads((tmp_path / INCARNATIONS).read_text()) == {"incarnations": [7, 11, 22, 33]}


def _rows(actor_id: int, version: PolicyVersion) -> dict:
    device, _ = envs.make("pendulum")
    rec = StepRecorder(device.observation_spec, device.action_spec, actor_id=actor_id, device_id=0)
    with device:
        obs = device.reset(seed=0)
        for _ in range(4):
            rec.add(obs, np.zeros(1, np.float32), np.zeros(1, np.float32), -1.0, False, False, version)
    return rec.flush().arrays()


def test_rows_of_an_earlier_learner_of_the_run_are_taken_and_of_any_other_refused(tmp_path):
    learner = ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="r", incarnation=2,
                            incarnations=(1,))
    device, _ = envs.make("pendulum")
    info = P.DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(learner.endpoint)
    try:
        sock.send_multipart(encode(P.HELLO, {"actor": "a", "actor_id": 1, "devices": [info.to_msg()],
                                             "held": [1, 4], "protocol": PROTOCOL_VERSION},
                                   protocol=P.HELLO_PROTOCOL))
        assert sock.poll(10_000) and decode(sock.recv_multipart()).kind == P.WELCOME
        for seq, version in enumerate([PolicyVersion(1, 4), PolicyVersion(3, 1), PolicyVersion(2, 0)], 1):
            sock.send_multipart(encode(P.STEPS, {"seq": seq, "device_id": 0, "held": [1, 4]}, _rows(1, version)))
        assert learner.wait(lambda s: s.data.committed_seq(1) == 3)
        said = learner.read(lambda s: s.server.stats.last_refusal["unknown_incarnation"])
    finally:
        sock.close(0)
        learner.close()
    assert [t.seq for t in learner.taken] == [1, 3]
    assert "policy_incarnation: row 0 holds 3" in said


def test_a_restarted_learner_takes_its_run_s_earlier_incarnations(tmp_path):
    config = TrainConfig(steps=0, learner=LearnerConfig(min_replay=10**9, checkpoint_every_s=3600, log_every_s=3600))
    config = dataclasses.replace(config, ddpg=dataclasses.replace(config.ddpg, hidden_sizes=(8,)))
    layout = envs.layout("pendulum")
    first = build_learner(config, layout, tmp_path)
    first.run()  # budget 0: publish, save, checkpoint, close
    second = build_learner(config, layout, tmp_path)
    try:
        assert {0, first.incarnation, second.incarnation} == set(second.server.incarnations)
    finally:
        second.run()
    third = build_learner(config, layout, tmp_path / "another-run")
    try:
        assert {0, third.incarnation} == set(third.server.incarnations)
    finally:
        third.run()
