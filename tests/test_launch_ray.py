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


def _config(steps: int, actors: int):
    from embodyrl.config import build_config, default_config

    return build_config(default_config("pendulum"), None, [
        ("steps", str(steps)), ("actors", str(actors)), ("sac.hidden_sizes", "[32, 32]"),
        ("learner.min_replay", "300"), ("actor.random_steps", "300"), ("eval_episodes", "1"),
        ("learner.peer_timeout_s", "10"), ("actor.flush_timeout_s", "60")])


@pytest.fixture
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 80 << 20})
    worker = cluster.add_node(num_cpus=2, resources={"robot-1": 1}, object_store_memory=80 << 20)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def _exactly_once(run_dir, actors: int) -> None:
    """Each actor's ledger = the replay's rows of that actor + what its spool still holds (batches
    sent as the learner said goodbye): equal rows and digests, so every row arrived once."""
    from embodyrl.hal.ledger import DIGEST_MOD, read_ledger
    from embodyrl.hal.wire.spool import Spool

    report = json.loads(subprocess.run([sys.executable, "-m", "embodyrl.cli", "replay", str(run_dir), "--json"],
                                       capture_output=True, text=True, timeout=60, check=True).stdout)
    for index in range(actors):
        pending = set(Spool(run_dir / "spools" / f"actor-{index}").seqs())
        delivered = [entry for seq, entry in read_ledger(run_dir / f"actor-{index}.ledger.jsonl").items()
                     if seq not in pending]
        rows, digest = sum(r for r, _ in delivered), sum(d for _, d in delivered) % DIGEST_MOD
        assert rows > 0, index
        assert (report["rows_by_actor"][str(index)], report["digest_by_actor"][str(index)]) == (rows, digest), index


def test_ray_places_restarts_and_loses_nothing(cluster, tmp_path):
    from embodyrl.cluster.ray_backend import RayLaunch

    _, worker = cluster
    run_dir = tmp_path / "run"
    launch = RayLaunch(_config(6000, 3), run_dir, actor_resources=[{}, {"robot-1": 1}, {}],
                       key_dir=str(tmp_path / "keys"))
    try:
        robot_actor = launch.actors[1]
        assert ray.get(robot_actor.node.remote()) == worker.node_id  # the robot's actor on its PC
        time.sleep(20)
        os.kill(ray.get(launch.actors[0].pid.remote()), signal.SIGKILL)  # the process, not ray.kill
        time.sleep(10)
        cluster[0].remove_node(worker)  # the robot's PC and its actor with it
        cluster[0].add_node(num_cpus=2, resources={"robot-1": 1}, object_store_memory=80 << 20)
        counters = launch.wait(timeout_s=900)
    finally:
        launch.stop()
    assert counters["env_steps"] >= 6000 and counters["updates"] > 0
    _exactly_once(run_dir, 3)


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
        assert proc.returncode == 1, proc.stderr[-2000:]
    finally:
        launch.stop()
