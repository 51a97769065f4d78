"""Ingest workers: a learner host whose actors' steps are taken by several processes, each on a port and a
replay shard of its own. Every row arrives once, in the shard its actor's index picks; the learner trains
on batches from every shard, keeps the index claims, and starts a killed worker again; a resumed learner
reopens every shard, and one with another worker count is refused."""

import dataclasses
import json
import os
import signal
import threading
import time

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.cli.replay_report import inspect
from embodyrl.config import default_config
from embodyrl.hal.steps import PolicyVersion, StepRecorder
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.client import HandshakeFailed, LearnerLink, LinkError
from embodyrl.hal.wire.security import ClientKeys, ServerKeys, generate_keys
from embodyrl.learner import make_learner
from embodyrl.learner.ingest import worker_bind
from embodyrl.learner.shards import ShardedReplay

ROWS = 16


@pytest.fixture(scope="module")
def pendulum():
    device, _ = envs.make("pendulum")
    return P.DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)


def _config(workers: int = 2):
    config = default_config("pendulum")
    return dataclasses.replace(config, steps=10**9, learner=dataclasses.replace(
        config.learner, ingest_workers=workers, min_replay=128, bind="tcp://127.0.0.1:*", updates_per_call=4,
        checkpoint_every_s=3600.0), ddpg=dataclasses.replace(config.ddpg, hidden_sizes=(32, 32), batch_size=32))


class Host:
    """A learner with ingest workers, served in a thread as ``embodyrl learner`` serves it."""

    def __init__(self, run_dir, config=None, **kwargs):
        self.learner = make_learner(config or _config(), run_dir, **kwargs)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.counters = None
        self._thread.start()

    def _run(self):
        self.counters = self.learner.run(self._stop.is_set, restart_on_stop=True)

    def stop(self):
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()
        return self.counters


class Actor:
    """One link and its batches of ``ROWS`` rows: each one episode of ``ROWS - 1`` steps and its final row."""

    def __init__(self, endpoint, info, actor_id, keys=None):
        self.info, self.actor_id, self.sent = info, actor_id, 0
        self.link = LearnerLink(endpoint, actor_name=f"actor {actor_id}", actor_id=actor_id, devices=[info],
                                keys=keys, handshake_timeout_s=30.0, peer_timeout_s=3.0)
        self.link.connect()

    def send(self):
        recorder = StepRecorder(self.info.observation_spec, self.info.action_spec, actor_id=self.actor_id,
                                device_id=0, capacity=ROWS)
        observation = {k: np.zeros(s.shape, s.dtype) for k, s in self.info.observation_spec.items()}
        action = np.zeros(self.info.action_spec.shape, self.info.action_spec.dtype)
        for t in range(ROWS - 1):
            recorder.add(observation, action, action, -1.0, t == ROWS - 2, False, PolicyVersion(0, -1))
        recorder.add_final(observation)
        self.link.send_steps(0, recorder.flush())
        self.sent += 1


def drive(actors, batches, timeout_s=60.0):
    """Each actor sends ``batches`` more batches as its credit allows; until every one is acknowledged."""
    target = {a.actor_id: a.sent + batches for a in actors}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for a in actors:
            if a.sent < target[a.actor_id] and a.link.credits >= ROWS:
                a.send()
            a.link.poll(2)
        if all(a.link.acked_seq >= target[a.actor_id] for a in actors):
            return
    raise TimeoutError({a.actor_id: (a.sent, a.link.acked_seq, a.link.credits, a.link.endpoint) for a in actors})


def stored_by_actor(run_dir) -> dict[int, int]:
    return {int(a): n for a, n in inspect(run_dir)["rows_by_actor"].items()}


def test_every_row_reaches_its_index_shard_once_and_the_learner_trains_on_every_shard(tmp_path, pendulum):
    host = Host(tmp_path / "run")
    try:
        workers = host.learner.data.workers
        ports = [w.port for w in workers.workers]
        actors = [Actor(host.learner.endpoint, pendulum, i) for i in range(4)]
        for a in actors:  # the learner's port named each its index's port
            assert P.ingest_endpoint(host.learner.endpoint, ports[a.actor_id % 2]) == a.link.endpoint
        drive(actors, 12)
        by_shard = [inspect(tmp_path / "run" / "replay" / f"shard-{k}")["rows_by_actor"] for k in range(2)]
        assert by_shard == [{"0": 12 * ROWS, "2": 12 * ROWS}, {"1": 12 * ROWS, "3": 12 * ROWS}]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (host.learner.counters.updates and all(
                a.link.held_version == host.learner.version for a in actors)):
            for a in actors:
                a.link.poll(5)
        assert host.learner.counters.updates > 0
        # each publication went to the workers once and from them to their actors
        assert all(a.link.held_version == host.learner.version for a in actors)
        keys = host.learner.data.last_batch_keys
        assert keys["slot"].shape == (4, host.learner.data.batch_size)  # both shards in every batch
        assert set(np.unique(keys["slot"] // 10**9).tolist()) <= {0}
        assert host.learner.server.stats.redirected >= 4
        for a in actors:
            a.link.close()
    finally:
        counters = host.stop()
    assert (counters.rows, counters.env_steps, counters.episodes) == (48 * ROWS, 48 * (ROWS - 1), 48)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["replay_shards"] == [24 * ROWS, 24 * ROWS]
    assert {r["episode_return"] for r in records if r["episode_return"] is not None} == {-(ROWS - 1)}
    assert records[-1]["policy_age_distribution"]["rows"] == 0  # acted by no policy of this learner


def test_a_killed_worker_starts_again_and_its_actors_lose_and_repeat_nothing(tmp_path, pendulum):
    host = Host(tmp_path / "run")
    try:
        workers = host.learner.data.workers
        actors = [Actor(host.learner.endpoint, pendulum, i) for i in range(2)]
        drive(actors, 6)
        os.kill(workers.workers[1].process.pid, signal.SIGKILL)
        drive(actors, 10, timeout_s=90)  # actor 1 dials the learner's port again, which names the new worker's
        assert workers.restarts == 1 and workers.workers[1].starts == 2
        assert stored_by_actor(tmp_path / "run") == {0: 16 * ROWS, 1: 16 * ROWS}
        assert actors[1].link.stats.reconnects >= 1
        updates, deadline = host.learner.counters.updates, time.monotonic() + 30
        drive(actors, 6)  # training goes on over both shards (the calls asked of the dead worker dropped)
        while host.learner.counters.updates <= updates and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.learner.counters.updates > updates
        for a in actors:
            a.link.close()
    finally:
        host.stop()


def test_a_resumed_learner_reopens_every_shard_and_another_worker_count_is_refused(tmp_path, pendulum):
    run = tmp_path / "run"
    host = Host(run)
    try:
        actors = [Actor(host.learner.endpoint, pendulum, i) for i in range(2)]
        drive(actors, 10)
        for a in actors:
            a.link.close()
    finally:
        host.stop()
    with pytest.raises(ValueError, match="holds 2 shards; resume it with learner.ingest_workers 2"):
        make_learner(_config(3), run)
    host = Host(run)
    try:
        assert host.learner.resumed
        actors = [Actor(host.learner.endpoint, pendulum, i) for i in range(2)]
        assert [a.link.acked_seq for a in actors] == [10, 10]  # each shard kept its actor's sequence
        for a in actors:
            a.sent = 10
        drive(actors, 2)
        assert stored_by_actor(run) == {0: 12 * ROWS, 1: 12 * ROWS}
        for a in actors:
            a.link.close()
    finally:
        host.stop()


def test_a_step_budget_ends_the_run_with_one_actor(tmp_path, pendulum):
    """The last of the budget is granted in a part quantum, as one process grants it: the run ends."""
    host = Host(tmp_path / "run", dataclasses.replace(_config(), steps=600))
    actor = Actor(host.learner.endpoint, pendulum, 0)
    deadline = time.monotonic() + 90
    while host._thread.is_alive() and time.monotonic() < deadline:
        if actor.link.credits >= ROWS:
            actor.send()
        actor.link.poll(2)
    counters = host.stop()
    assert 600 <= counters.env_steps <= 600 + 64, counters
    actor.link.close(send_bye=False)


def test_index_claims_stay_the_learners_across_its_workers(tmp_path, pendulum):
    learner_public, learner_secret = generate_keys(tmp_path / "learner", "learner")
    robot_public, robot_secret = generate_keys(tmp_path / "authorized", "robot")
    host = Host(tmp_path / "run", keys=ServerKeys(learner_secret, tmp_path / "authorized"))
    try:
        keys = ClientKeys(robot_secret, learner_public)
        first = Actor(host.learner.endpoint, pendulum, 0, keys=keys)  # binds the key to index 0 (worker 0)
        drive([first], 2)
        with pytest.raises((HandshakeFailed, LinkError), match="acts as actor 0"):
            Actor(host.learner.endpoint, pendulum, 1, keys=keys)  # worker 1 asks the learner, which says no
        first.link.close()
    finally:
        host.stop()


def test_importance_weights_over_shards_are_one_replays_for_the_two_stage_draw():
    """Shard s (N_s rows) brings B_s ~ B N_s / N rows, each drawn with P(row | s): P(row) = N_s/N P(row | s),
    so w = (N P(row))^-beta = (N_s P(row | s))^-beta, normalised over the whole batch."""
    p0, p1 = np.array([[0.1, 0.3]]), np.array([[0.05]])
    got = [(0, {"stored": 100}, {"keys/probability": p0, "x": np.zeros((1, 2))}),
           (1, {"stored": 300}, {"keys/probability": p1, "x": np.ones((1, 1))})]
    batch, keys = ShardedReplay._assemble(got, beta=0.5)
    w = np.array([[100 * 0.1, 100 * 0.3, 300 * 0.05]]) ** -0.5
    np.testing.assert_allclose(batch["weight"], w / w.max(), rtol=1e-6)
    np.testing.assert_array_equal(batch["x"], [[0, 0, 1]])


def test_worker_ports_follow_a_fixed_learner_port_and_need_tcp():
    assert worker_bind("tcp://0.0.0.0:5555", 1) == "tcp://0.0.0.0:5557"
    assert worker_bind("tcp://127.0.0.1:*", 0) == "tcp://127.0.0.1:*"
    with pytest.raises(ValueError, match="need a TCP address"):
        worker_bind("ipc:///tmp/learner", 0)


def test_a_relay_takes_its_actors_to_their_ingest_workers_and_serves_them_weights(tmp_path, pendulum):
    from test_relay import RelayThread

    host = Host(tmp_path / "run")
    relay = RelayThread(host.learner.endpoint, "tcp://127.0.0.1:*", name="rack")
    try:
        actors = [Actor(relay.endpoint, pendulum, i) for i in range(2)]
        assert all(a.link.endpoint == relay.endpoint for a in actors)  # the relay follows the redirect, not they
        drive(actors, 8)
        assert stored_by_actor(tmp_path / "run") == {0: 8 * ROWS, 1: 8 * ROWS}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(a.link.held_version == host.learner.version for a in actors):
            for a in actors:
                a.link.poll(5)
        assert all(a.link.held_version == host.learner.version for a in actors)
        assert relay.relay.stats.weights_sent >= 2  # the relay served them, not the workers
        for a in actors:
            a.link.close()
    finally:
        relay.stop()
        host.stop()


@pytest.mark.parametrize("change", [{"algorithm": "ppo"}, {"mix": {"demonstration": 0.5, "online": 0.5}}],
                         ids=["on-policy", "mix"])
def test_what_needs_one_replay_is_refused_with_ingest_workers_by_name(tmp_path, change):
    from embodyrl.config import TrainConfig, apply_algorithm_defaults, from_dict, to_dict

    config = _config()
    if "algorithm" in change:
        config = from_dict(TrainConfig, apply_algorithm_defaults({**to_dict(config), "algorithm": "ppo"}))
        match = "ingest_workers: ppo learns on-policy"
    else:
        config = dataclasses.replace(config, learner=dataclasses.replace(config.learner, mix=change["mix"]))
        match = "learner.mix: the replay's shards hold actors' rows"
    with pytest.raises(ValueError, match=match):
        make_learner(config, tmp_path / "run")


def test_a_worker_counts_rows_by_publication_for_the_learner_to_age():
    from embodyrl.learner.ingest_worker import PublicationCounts

    counts = PublicationCounts()
    counts.taken(np.array([3, 3, 5]), updates=0)
    counts.taken(np.array([5]), updates=7)
    assert counts.take() == [(3, 2), (5, 2)] and counts.take() == []
