"""A learner and actors that find each other through a rendezvous record (files in the run
directory): each actor's own key pair on its own "node", only public keys in the record, the
learner admitting the keys added there while it runs, and refusing every other key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from embodyrl.cluster.rendezvous import (
    FileRecord,
    LearnerEntry,
    RendezvousError,
    own_key_pair,
    wait_for_learner,
)


def _start(*args, log=None):
    return subprocess.Popen([sys.executable, "-m", "embodyrl.cli", *args], stdout=subprocess.PIPE,
                            stderr=log.open("w") if log else subprocess.PIPE, text=True, start_new_session=True)


def _kill(*procs):
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_the_file_record_holds_the_learner_entry_and_public_keys_only(tmp_path):
    record = FileRecord(tmp_path / "rendezvous")
    assert record.learner() is None
    with pytest.raises(RendezvousError, match="no learner in the rendezvous record within 0.3 s"):
        wait_for_learner(record, 0.3)
    public, secret = own_key_pair(tmp_path / "node-a", "actor-0")
    assert own_key_pair(tmp_path / "node-a", "actor-0") == (public, secret)  # kept across restarts
    record.add_actor_key("actor-0", public)
    entry = LearnerEntry("tcp://10.0.0.5:5555", "x" * 40, "run-1", 7)
    record.publish_learner(entry)
    assert wait_for_learner(record, 1.0) == entry
    assert record.actor_keys() == {"actor-0": public}
    assert not list((tmp_path / "rendezvous").rglob("*secret*"))  # no secret key ever in the record
    (tmp_path / "rendezvous" / "learner.json").write_text("{not json")
    with pytest.raises(RendezvousError, match="not a learner entry"):
        record.learner()


def test_actors_find_the_learner_through_the_record_and_a_stranger_is_refused(tmp_path):
    run = tmp_path / "run"
    rendezvous = run / "rendezvous"
    learner = _start("learner", "pendulum", "--run-dir", str(run), "--rendezvous", str(rendezvous),
                     "--steps", "1200", "--sac.hidden_sizes", "[32, 32]", "--learner.min_replay", "200",
                     "--actor.random_steps", "200", "--learner.updates_per_step", "2",
                     "--learner.rate_tolerance", "512", log=tmp_path / "learner.err")
    actors = []
    try:
        line = learner.stdout.readline()
        assert line, (tmp_path / "learner.err").read_text()[-3000:]
        endpoint = json.loads(line)["endpoint"]
        entry = FileRecord(rendezvous).learner()
        assert entry.endpoint == endpoint and entry.run_id == "run" and entry.incarnation > 0
        # a stranger with its own keys and the learner's public key: CURVE never lets it in
        _, rogue_secret = own_key_pair(tmp_path / "rogue", "rogue")
        learner_key = tmp_path / "learner.key"
        learner_key.write_text((run / "keys" / "learner.key").read_text())
        stranger = subprocess.run(
            [sys.executable, "-m", "embodyrl.cli", "actor", "pendulum", "--connect", endpoint, "--index", "5",
             "--config", str(run / "config.json"), "--secret-key", str(rogue_secret), "--server-key",
             str(learner_key), "--learner.peer_timeout_s", "3", "--actor.handshake_timeout_s", "5"],
            capture_output=True, text=True, timeout=120)
        assert stranger.returncode == 2, stranger.stderr[-2000:]  # the handshake's failure is certain: at once
        assert "not authorised there" in stranger.stderr and "Traceback" not in stranger.stderr
        for index in (0, 1):  # each on its own "node": its own key directory
            actors.append(_start("actor", "pendulum", "--rendezvous", str(rendezvous), "--index", str(index),
                                 "--key-dir", str(tmp_path / f"node{index}"), "--config", str(run / "config.json"),
                                 "--log-dir", str(tmp_path / "logs"), log=tmp_path / f"actor{index}.err"))
        out, _ = learner.communicate(timeout=600)
        assert learner.returncode == 0, (tmp_path / "learner.err").read_text()[-3000:]
    finally:
        _kill(learner, *actors)  # (an actor that joined after the learner's goodbye would wait for it)
    assert json.loads(out.strip().splitlines()[-1])["env_steps"] >= 1200
    assert set(FileRecord(rendezvous).actor_keys()) == {"actor-0", "actor-1"}  # the stranger never got in
    assert not list(rendezvous.rglob("*secret*"))
    for index in (0, 1):  # each node keeps its own secret
        assert (tmp_path / f"node{index}" / f"actor-{index}.key_secret").exists()
    report = subprocess.run([sys.executable, "-m", "embodyrl.cli", "replay", str(run), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert set(json.loads(report.stdout)["rows_by_actor"]) == {"0", "1"}
