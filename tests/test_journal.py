"""The journal of rows recorded but not yet spooled: what a SIGKILLed actor had not batched is sent
by its restart, once. The process-level check (a real SIGKILL, steps counted in shared memory) is
``test_chaos.py``'s actor kill."""

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.journal import journal_path
from embodyrl.hal.policy import UniformRandomPolicy
from embodyrl.hal.steps import NO_POLICY, StepRecorder
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.protocol import DeviceInfo
from embodyrl.hal.wire.spool import Spool


@pytest.fixture(scope="module")
def pendulum():
    device, task = envs.make("pendulum")
    with device:
        yield device, task


def record(recorder, device, rows: int, *, final: bool = False):
    observation = device.reset(seed=0)
    for _ in range(rows):
        action = device.action_spec.clip(np.full(device.action_spec.shape, 0.5, device.action_spec.dtype))
        following = device.step(action)
        recorder.add(observation, action, action, 1.0, False, False, NO_POLICY)
        observation = following
    if final:
        recorder.add_final(observation)


def test_rows_recorded_and_never_flushed_come_back_in_the_next_recorder(pendulum, tmp_path):
    device, _ = pendulum
    path = tmp_path / "device-0.rows"
    spec = (device.observation_spec, device.action_spec)
    first = StepRecorder(*spec, actor_id=3, device_id=0, journal=path)
    record(first, device, 5, final=True)
    expected = first.flush()  # taken, never spooled: the process dies here
    again = StepRecorder(*spec, actor_id=3, device_id=0, journal=path)
    recovered = again.recovered()
    assert len(recovered) == 6 and recovered.final[-1] and not recovered.final[:-1].any()
    for name, column in expected.arrays().items():
        np.testing.assert_array_equal(recovered.arrays()[name], column, err_msg=name)
    again.spooled()
    assert StepRecorder(*spec, actor_id=3, device_id=0, journal=path).recovered() is None


def test_a_record_torn_by_the_kill_is_dropped_and_the_whole_ones_kept(pendulum, tmp_path):
    device, _ = pendulum
    path = tmp_path / "device-0.rows"
    spec = (device.observation_spec, device.action_spec)
    record(StepRecorder(*spec, actor_id=0, device_id=0, journal=path), device, 4)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 7)
    assert len(StepRecorder(*spec, actor_id=0, device_id=0, journal=path).recovered()) == 3


def test_a_journal_of_other_columns_is_kept_aside_not_sent_or_overwritten(pendulum, tmp_path):
    device, _ = pendulum
    arm, _ = envs.make("arm_reach")
    path = tmp_path / "device-0.rows"
    record(StepRecorder(device.observation_spec, device.action_spec, actor_id=0, device_id=0, journal=path), device, 2)
    before = path.read_bytes()
    with arm, pytest.warns(UserWarning, match="other columns"):
        recorder = StepRecorder(arm.observation_spec, arm.action_spec, actor_id=0, device_id=0, journal=path)
    assert recorder.recovered() is None
    (aside,) = tmp_path.glob("device-0.rows.stale-*")
    assert aside.read_bytes() == before


def actor(device, task, spool_dir):
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink("tcp://127.0.0.1:9", actor_name="journal", actor_id=1, devices=[info],
                       spool=Spool(spool_dir))  # never connected: batches wait in the spool
    return ActorLoop(device, task, UniformRandomPolicy(device.action_spec, seed=1), link,
                     ActorConfig(actor_id=1, send_every=16, random_steps=10**9, seed=1,
                                 realtime=True))  # a robot: it spools, never waits for credit


def test_a_restarted_actor_spools_its_predecessors_unbatched_rows_once(pendulum, tmp_path):
    device, task = pendulum
    killed = actor(device, task, tmp_path)
    lane = killed.lanes[0]
    lane.observation = device.reset(seed=0)
    for _ in range(37):  # two batches of 16 spooled, 5 rows recorded: the kill comes now
        killed._step(lane, warm=True)
    assert len(killed.link.spool) == 2 and len(lane.recorder) == 5
    assert journal_path(tmp_path, 0).exists()

    restarted = actor(device, task, tmp_path)
    restarted._send_recovered()
    spool = restarted.link.spool
    assert len(spool) == 3 and spool.rows == 37 and restarted.stats.recovered_rows == 5
    assert restarted.lanes[0].recorder.recovered() is None  # the journal forgot them once spooled
    assert actor(device, task, tmp_path).lanes[0].recorder.recovered() is None


def test_rows_spooled_by_a_process_killed_before_it_emptied_its_journal_are_not_sent_twice(pendulum, tmp_path):
    device, task = pendulum
    killed = actor(device, task, tmp_path)
    lane = killed.lanes[0]
    lane.observation = device.reset(seed=0)
    for _ in range(5):
        killed._step(lane, warm=True)
    killed.link.send_steps(0, lane.recorder.flush())  # spooled; the journal still holds the rows
    restarted = actor(device, task, tmp_path)
    restarted._send_recovered()
    assert len(restarted.link.spool) == 1 and restarted.stats.recovered_rows == 0
    assert restarted.lanes[0].recorder.recovered() is None
