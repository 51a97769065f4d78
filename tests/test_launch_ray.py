"""``embodyrl launch ray`` on a real two-node Ray cluster on this host (``ray.cluster_utils.Cluster``):
the learner on the head node, actors on both, found through the record in Ray's store; an actor's
process killed and a whole node removed, Ray restarting the actors, and the batch ledgers against
the replay showing every row arrived exactly once."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is the [ray] extra")

pytestmark = pytest.mark.slow

from tests.ledger_helpers import exactly_once  # noqa: E402


def _config(steps: int, actors: int):
    from embodyrl.config import build_config, default_config

    return build_config(default_config("pendulum"), None, [
        ("steps", str(steps)), ("actors", str(actors)), ("sac.hidden_sizes", "[32, 32]"),
        ("learner.min_replay", "300"), ("actor.random_steps", "300"), ("eval_episodes", "1"),
        ("learner.peer_timeout_s", "10"), ("actor.flush_timeout_s", "60")])


@pytest.fixture
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "object_store_memory": 80 << 20})
    worker = cluster.add_node(num_cpus=2, resources={"robot-1": 1}, object_store_memory=80 << 20)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def _process(run_dir, name: str, timeout_s: float = 300, other_than: int | None = None) -> dict:
    """The process playing ``name`` now (``RUN_DIR/processes``), once it is there (and not ``other_than``)."""
    path = run_dir / "processes" / f"{name}.json"
    deadline = time.monotonic() + timeout_s
    while True:
        if path.exists():
            found = json.loads(path.read_text())
            if found["pid"] != other_than:
                return found
        assert time.monotonic() < deadline, f"no {'new ' if other_than else ''}process for {name}"
        time.sleep(0.5)


def _streaming(run_dir, index: int, batches: int, timeout_s: float = 300) -> None:
    ledger = run_dir / f"actor-{index}.ledger.jsonl"
    deadline = time.monotonic() + timeout_s
    while not (ledger.exists() and len(ledger.read_text().splitlines()) >= batches):
        assert time.monotonic() < deadline, f"actor {index} sent fewer than {batches} batches"
        time.sleep(0.5)


def test_ray_places_restarts_and_loses_nothing(cluster, tmp_path):
    from embodyrl.cluster.ray_backend import RayLaunch

    head, worker = cluster
    run_dir = tmp_path / "run"
    config = _config(8000, 3)
    config = dataclasses.replace(config, learner=dataclasses.replace(config.learner, checkpoint_every_s=5.0),
                                 actor=dataclasses.replace(config.actor, realtime=True))  # paced: time for the kills
    launch = RayLaunch(config, run_dir, actor_resources=[{}, {"robot-1": 1}, {}], key_dir=str(tmp_path / "keys"))
    try:
        assert _process(run_dir, "actor-1")["node"] == worker.node_id  # the robot's actor on its PC
        _streaming(run_dir, 0, 5)
        killed = _process(run_dir, "actor-0")["pid"]
        os.kill(killed, signal.SIGKILL)  # the process, not ray.kill
        assert _process(run_dir, "actor-0", other_than=killed)["pid"] != killed  # Ray started it again
        learner = _process(run_dir, "learner")["pid"]
        time.sleep(6)  # a checkpoint
        os.kill(learner, signal.SIGKILL)
        _process(run_dir, "learner", other_than=learner)  # restarted on its node; resumes its run
        lost = _process(run_dir, "actor-1")["pid"]
        head.remove_node(worker)  # the robot's PC, and its actor with it
        head.add_node(num_cpus=2, resources={"robot-1": 1}, object_store_memory=80 << 20)
        _process(run_dir, "actor-1", other_than=lost)
        counters = launch.wait(timeout_s=1200)
    finally:
        launch.stop()
    assert counters["env_steps"] >= 8000 and counters["updates"] > 0
    exactly_once(run_dir, 3)


def test_an_actor_whose_key_is_not_in_the_record_is_refused(cluster, tmp_path):
    from embodyrl.cluster.ray_backend import RayLaunch
    from embodyrl.cluster.rendezvous import RayRecord, own_key_pair, public_key_text

    launch = RayLaunch(dataclasses.replace(_config(10**6, 0)), tmp_path / "run", key_dir=str(tmp_path / "keys"))
    try:
        from embodyrl.cluster.rendezvous import wait_for_learner

        entry = wait_for_learner(RayRecord("run"), 300)
        _, secret = own_key_pair(tmp_path / "stranger", "actor-9")  # never added to the record
        server_key = tmp_path / "learner.key"
        server_key.write_text(public_key_text(entry.public_key))
        proc = subprocess.run(
            [sys.executable, "-m", "embodyrl.cli", "actor", "pendulum", "--connect", entry.endpoint, "--index", "9",
             "--config", str(tmp_path / "run" / "config.json"), "--secret-key", str(secret), "--server-key",
             str(server_key), "--learner.peer_timeout_s", "3"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]  # refused at once: the handshake's failure is certain
        assert "not authorised there" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        launch.stop()
