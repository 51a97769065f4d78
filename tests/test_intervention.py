"""Human intervention through the actor loop, and demonstrations written, loaded and sent."""

import os
import time

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.demos import DemoWriter, load_demonstrations, read_specs, send_demonstrations
from embodyrl.hal.intervention import (
    HeldCommand,
    InterventionSource,
    KeyboardTeleop,
    ScriptedIntervention,
)
from embodyrl.hal.policy import UniformRandomPolicy
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.specs import SpecError
from embodyrl.hal.steps import NO_POLICY, Source, StepRecorder
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.protocol import DeviceInfo
from embodyrl.learner.testing import ServedLearner


class ConstantPolicy(UniformRandomPolicy):
    def act(self, observation, *, explore=True):
        return np.array([0.5], np.float32), {"log_prob": -1.5}


@pytest.fixture
def learner(tmp_path):
    with ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="intervention", incarnation=7,
                       peer_timeout_s=20) as served:
        yield served


def connect(server, device, device_ids=(0,)):
    infos = [DeviceInfo(i, "pendulum", device.observation_spec, device.action_spec) for i in device_ids]
    return LearnerLink(server.endpoint, actor_name="human", actor_id=1, devices=infos,
                       handshake_timeout_s=20, peer_timeout_s=20)


def wait_acked(link):
    deadline = time.monotonic() + 20
    while link.unacked_rows and time.monotonic() < deadline:
        link.poll(20)
    assert link.unacked_rows == 0


def test_scripted_overrides_are_tagged_and_pass_the_safety_layer(learner, tmp_path):
    raw, task = envs.make("pendulum")
    device = SafeDevice(raw, SafetyConfig())
    human = ScriptedIntervention({3: np.array([5.0], np.float32), 4: np.array([-1.0], np.float32)})
    assert isinstance(human, InterventionSource)
    writer = DemoWriter(tmp_path / "teleop.npz", device.observation_spec, device.action_spec)
    link = connect(learner.server, device)
    with device, link:
        loop = ActorLoop(device, task, ConstantPolicy(device.action_spec), link,
                         ActorConfig(actor_id=1, send_every=50, random_steps=0), intervention=human,
                         tap=writer)
        stats = loop.run(max_steps=200)
        wait_acked(link)
    assert stats.interventions == 2 and human.overrides == 2
    assert stats.safety["clipped"] == 1  # the person's 5.0 exceeds the 2 N m limit
    rows = np.concatenate([b.steps.source for b in learner.taken])
    proposed = np.concatenate([b.steps.proposed_action for b in learner.taken])[:, 0]
    applied = np.concatenate([b.steps.action for b in learner.taken])[:, 0]
    assert rows[3] == Source.INTERVENTION and rows[4] == Source.INTERVENTION
    assert (rows[[0, 1, 2, 5, 6]] == Source.ONLINE).all()
    assert proposed[3] == 0.5 and applied[3] == 2.0   # policy proposed 0.5; the human's 5.0, clipped
    assert proposed[4] == 0.5 and applied[4] == -1.0
    assert applied[5] == 0.5
    # the tap saw what was sent: a complete episode of 200 steps + its final row
    path = writer.close()
    assert path.exists()


def test_held_command_overrides_while_held():
    held = HeldCommand()
    obs = {}
    assert held.poll(obs) is None
    held.hold([0.3])
    assert held.poll(obs).tolist() == pytest.approx([0.3])
    held.release()
    assert held.poll(obs) is None


def test_demonstrations_round_trip_and_go_to_the_learner_as_their_own_source(learner, tmp_path):
    raw, task = envs.make("pendulum")
    path = tmp_path / "demo.npz"
    writer = DemoWriter(path, raw.observation_spec, raw.action_spec)
    with raw:
        # record two teleoperated episodes (a person holding a constant torque)
        rec = StepRecorder(raw.observation_spec, raw.action_spec, actor_id=0, device_id=0, capacity=300)
        for episode in range(2):
            obs = raw.reset(seed=episode)
            for t in range(task.max_episode_steps):
                action = np.array([1.0], np.float32)
                nxt = raw.step(action)
                rec.add(obs, action, action, task.reward(obs, action, nxt), False,
                        t == task.max_episode_steps - 1, NO_POLICY, source=Source.INTERVENTION)
                obs = nxt
            rec.add_final(obs)
            writer.add(rec.flush())
    writer.close()
    # the format: plain arrays, no pickle, columns as on the wire
    with np.load(path, allow_pickle=False) as data:
        assert {"meta", "action", "proposed_action", "reward", "observation/orientation"} <= set(data.files)
        assert data["action"].shape == (402, 1)
    obs_spec, act_spec = read_specs(path)
    assert obs_spec == raw.observation_spec and act_spec == raw.action_spec

    batches = load_demonstrations(path, batch_rows=100, actor_id=1, device_id=9,
                                  observation_spec=raw.observation_spec)
    assert [len(b) for b in batches] == [100, 100, 100, 100, 2]
    for b in batches:
        assert (b.source == Source.DEMONSTRATION).all()
        assert (b.device_id == 9).all() and (b.actor_id == 1).all()
    link = connect(learner.server, raw, device_ids=(0, 9))
    with link:
        sent = send_demonstrations(link, 9, batches)
        wait_acked(link)
    assert sent == 402
    received = [b for b in learner.taken if b.device_id == 9]
    assert sum(len(b.steps) for b in received) == 402
    assert all((b.steps.source == Source.DEMONSTRATION).all() for b in received)
    assert sum(b.steps.final.sum() for b in received) == 2


def test_bad_demonstration_files_are_refused_with_the_reason(tmp_path):
    raw, _ = envs.make("pendulum")
    not_npz = tmp_path / "junk.npz"
    not_npz.write_bytes(b"not a zip")
    with pytest.raises(SpecError, match="not a readable"):
        load_demonstrations(not_npz)
    no_meta = tmp_path / "nometa.npz"
    np.savez(no_meta, action=np.zeros((3, 1), np.float32))
    with pytest.raises(SpecError, match="meta"):
        load_demonstrations(no_meta)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, meta=np.array(["x", {"evil": 1}], dtype=object))
    with pytest.raises(SpecError, match="meta"):
        load_demonstrations(pickled)
    # a valid file with a column missing, and one loaded against other specs
    good = tmp_path / "good.npz"
    writer = DemoWriter(good, raw.observation_spec, raw.action_spec)
    with pytest.raises(ValueError, match="no steps"):
        writer.close()
    arm, _ = envs.make("arm_reach")
    rec = StepRecorder(raw.observation_spec, raw.action_spec, actor_id=0, device_id=0)
    with raw:
        obs = raw.reset(seed=0)
        rec.add(obs, np.zeros(1, np.float32), np.zeros(1, np.float32), 0.0, False, True, NO_POLICY)
        rec.add_final(raw.step(np.zeros(1, np.float32)))
    writer.add(rec.flush())
    writer.close()
    with pytest.raises(SpecError, match="action 'action': shape \\(1,\\) but the task's is \\(7,\\)"):
        load_demonstrations(good, action_spec=arm.action_spec)
    with np.load(good, allow_pickle=False) as data:
        columns = {k: data[k] for k in data.files if k != "reward"}
    broken = tmp_path / "broken.npz"
    np.savez(broken, **columns)
    with pytest.raises(SpecError, match="reward"):
        load_demonstrations(broken)
    columns["reward"] = np.array([object(), object()], dtype=object)
    np.savez(broken, **columns)
    with pytest.raises(SpecError, match="column reward"):
        load_demonstrations(broken)


def test_keyboard_teleop_holds_a_key_press_then_returns_control():
    read_fd, write_fd = os.pipe()
    keys = KeyboardTeleop({"a": np.array([-1.0], np.float32), "d": np.array([1.0], np.float32)},
                          fd=read_fd, hold_s=0.2)
    try:
        assert isinstance(keys, InterventionSource)
        assert keys.poll({}) is None
        os.write(write_fd, b"xd")  # an unmapped key, then "d"
        deadline = time.monotonic() + 2
        while keys.poll({}) is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert keys.poll({}).tolist() == [1.0]
        time.sleep(0.3)
        assert keys.poll({}) is None  # released: the policy acts again
        with pytest.raises(ValueError, match="keymap"):
            KeyboardTeleop({"up": np.zeros(1)}, fd=read_fd)
    finally:
        keys.close()
        os.close(read_fd)
        os.close(write_fd)
