"""The actor loop with the safety layer, the clock and the counters; the actor process's JSONL."""

import json
import multiprocessing as mp
import threading
import time

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.cli.processes import actor_main
from embodyrl.config import TrainConfig, to_dict
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.steps import Source
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.protocol import DeviceInfo
from embodyrl.learner.testing import ServedLearner
from embodyrl.transport import LearnerServer
from tests.robot_helpers import Alternating


@pytest.fixture
def learner(tmp_path):
    with ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="actor", incarnation=3,
                       peer_timeout_s=20) as served:
        yield served


def run_loop(learner, device, task, config, max_steps, **kw):
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink(learner.server.endpoint, actor_name="t", actor_id=config.actor_id,
                       devices=[info], handshake_timeout_s=20, peer_timeout_s=20)
    with device, link:
        loop = ActorLoop(device, task, Alternating(), link, config)
        stats = loop.run(max_steps=max_steps, **kw)
        deadline = time.monotonic() + 20
        while link.unacked_rows and time.monotonic() < deadline:
            link.poll(20)
    return stats


def test_records_proposed_and_applied_actions_and_counts_safety(learner):
    raw, task = envs.make("pendulum")
    device = SafeDevice(raw, SafetyConfig(max_delta=0.5))
    reports = []
    stats = run_loop(learner, device, task, ActorConfig(send_every=32, random_steps=0), 100,
                     report=reports.append, report_every_s=0.0)
    proposed = np.concatenate([b.steps.proposed_action for b in learner.taken])[:, 0]
    applied = np.concatenate([b.steps.action for b in learner.taken])[:, 0]
    assert len(proposed) == 100
    assert set(np.abs(proposed).tolist()) == {2.0}
    assert (np.abs(np.diff(applied)) <= 0.5 + 1e-6).all()   # the rate limit held on every row
    assert abs(applied[0]) == 2.0                            # nothing to limit against after reset
    limited = int(np.count_nonzero(applied != proposed))
    assert limited >= 49  # -2, then +2 is limited to -1.5, then -2 is reachable again, ...
    assert stats.safety["rate_limited"] == limited and stats.safety["clipped"] == 0
    assert all((b.steps.source == Source.ONLINE).all() for b in learner.taken)
    assert len(reports) >= 2 and reports[-1]["safety"]["rate_limited"] == limited
    assert reports[-1]["env_steps"] == 100 and json.dumps(reports[-1])


def test_realtime_loop_runs_at_the_control_rate_and_reports_its_clock(learner):
    raw, task = envs.make("pendulum")  # 0.05 s control period: 20 Hz
    start = time.monotonic()
    stats = run_loop(learner, SafeDevice(raw), task,
                     ActorConfig(send_every=16, random_steps=0, realtime=True), 20)
    elapsed = time.monotonic() - start
    assert elapsed >= 19 * 0.05
    assert stats.clock["ticks"] == 20 and "p99_ms" in stats.clock and "missed" in stats.clock


def test_the_actor_process_writes_its_counters_as_jsonl(tmp_path):
    learner = ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="jsonl", incarnation=11,
                            peer_timeout_s=30)  # admits only the pendulum's specs
    ctx = mp.get_context("spawn")
    config = TrainConfig(task="pendulum")
    actor = ctx.Process(target=actor_main, args=(to_dict(config), learner.endpoint, 0, str(tmp_path)))
    actor.start()
    log = tmp_path / "actor-0.jsonl"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if log.exists() and len(log.read_text().splitlines()) >= 2:
                break
            assert actor.is_alive(), f"actor exited with {actor.exitcode}"
            time.sleep(0.2)
        actor.terminate()  # SIGTERM: the loop stops cleanly and writes a last line
        actor.join(30)
        assert actor.exitcode == 0
    finally:
        if actor.is_alive():
            actor.kill()
            actor.join(5)
        learner.close()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) >= 3
    last = lines[-1]
    assert last["actor"] == 0 and last["env_steps"] > 0
    assert set(last["safety"]) >= {"clipped", "rate_limited", "workspace", "watchdog", "estop"}
    assert last["interventions"] == 0
    assert [ln["env_steps"] for ln in lines] == sorted(ln["env_steps"] for ln in lines)


def test_a_task_that_truncates_on_its_own_ends_the_episode_with_truncation(learner):
    from embodyrl.hal.task import Task

    device, pendulum = envs.make("pendulum")

    class TruncatesEveryFifthStep(Task):  # as a wrapped Gymnasium env may, before any time limit
        steps = 0

        def reward(self, observation, action, next_observation):
            return pendulum.reward(observation, action, next_observation)

        def truncated(self, next_observation):
            self.steps += 1
            return self.steps % 5 == 0

    run_loop(learner, device, TruncatesEveryFifthStep(), ActorConfig(send_every=8, random_steps=0), 20)
    rows = [row for b in learner.taken for row in zip(b.steps.truncated.tolist(), b.steps.final.tolist(),
                                                          strict=True)]
    assert [t for t, final in rows if not final] == ([False] * 4 + [True]) * 4
    assert sum(final for _, final in rows) == 4


def test_a_stop_signal_ends_a_wait_for_credit_and_spools_the_rows():
    server = LearnerServer(run_id="stingy", incarnation=5, peer_timeout_s=20)  # never grants credit
    device, task = envs.make("pendulum")
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink(server.endpoint, actor_name="t", actor_id=1, devices=[info], handshake_timeout_s=20)
    stop_at = time.monotonic() + 2.0
    try:
        serving = threading.Event()

        def serve():
            while not serving.is_set():
                server.poll(20)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with device, link:
            start = time.monotonic()
            ActorLoop(device, task, Alternating(), link, ActorConfig(send_every=16, credit_timeout_s=60)).run(
                should_stop=lambda: time.monotonic() > stop_at)
            assert time.monotonic() - start < 10  # not the 60 s credit timeout
            assert link.spool.rows >= 16  # what it had recorded waits in the spool, not lost
        serving.set()
        thread.join(5)
    finally:
        server.close()


class StallsOnce(Alternating):
    """Stalls past the robot server's watchdog before its sixth action (a learner compiling, say)."""

    def __init__(self, stall_s: float):
        super().__init__()
        self.calls, self.stall_s = 0, stall_s

    def act(self, observation, *, explore):
        self.calls += 1
        if self.calls == 6:
            time.sleep(self.stall_s)
        return super().act(observation, explore=explore)


def test_a_robot_servers_watchdog_trip_restarts_the_episode_instead_of_ending_the_actor(learner):
    from embodyrl.hal.drivers.remote import RemoteDevice
    from embodyrl.hal.robot_server import DeviceDriver, RobotServer

    server = RobotServer(DeviceDriver(envs.make("pendulum")[0]), watchdog_s=0.2)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        device, task = RemoteDevice(server.endpoint, timeout_s=2.0, retries=1), envs.make("pendulum")[1]
        device.connect()
        info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
        with device, LearnerLink(learner.server.endpoint, actor_name="t", actor_id=0, devices=[info],
                                 handshake_timeout_s=20, peer_timeout_s=20) as link:
            loop = ActorLoop(device, task, StallsOnce(stall_s=0.6), link,
                             ActorConfig(actor_id=0, send_every=4, random_steps=0))
            with pytest.warns(UserWarning, match="watchdog"):
                stats = loop.run(max_steps=12)
        assert stats.interrupted == 1 and stats.episodes == 0
        assert stats.env_steps == 11  # the refused step is not recorded; every other one is
        assert server.stats.watchdog_trips == 1
    finally:
        stop.set()
        thread.join(5)
