"""A real-time actor never blocks on a dead learner: it spools, then pauses its devices safely.
An actor whose learner never comes back exits non-zero, saying what its spool still holds; a
restart on the same spool delivers it."""

import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.bench.chaos_parts import free_port
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.ledger import ledger_totals, read_ledger
from embodyrl.hal.policy import UniformRandomPolicy
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.spool import Spool
from embodyrl.transport import LearnerServer


def connected_link(spool, peer_timeout_s=0.5):
    device, _ = envs.make("pendulum")
    server = LearnerServer(run_id="r", incarnation=1)
    info = P.DeviceInfo(0, "p", device.observation_spec, device.action_spec)
    link = LearnerLink(server.endpoint, actor_name="rt", actor_id=0, devices=[info], handshake_timeout_s=5,
                       peer_timeout_s=peer_timeout_s, spool=spool)
    stop = threading.Event()
    pump = threading.Thread(target=lambda: [server.poll(10) for _ in iter(stop.is_set, True)], daemon=True)
    pump.start()
    link.connect()
    stop.set()
    pump.join()
    server.close()  # the learner dies right after the handshake
    return link


def test_realtime_actor_keeps_its_rate_then_pauses_safely_when_the_spool_fills():
    link = connected_link(Spool(disk_bytes=8_000))  # room for a few batches only
    device, task = envs.make("pendulum")
    safe = SafeDevice(device, SafetyConfig(safe_action=(0.0,)))
    steps = 150  # 3 s at the pendulum's 50 Hz
    loop = ActorLoop(safe, task, UniformRandomPolicy(safe.action_spec, seed=0), link,
                     ActorConfig(send_every=16, random_steps=10**9, realtime=True))
    with safe, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.monotonic()
        stats = loop.run(max_steps=steps)
        elapsed = time.monotonic() - start
    assert elapsed < steps * safe.control_period_s * 1.5 + 1.0, "the loop blocked on the network"
    assert stats.pauses == 1 and stats.paused_steps > 0
    assert stats.env_steps + stats.paused_steps == steps
    assert any("devices paused in their safe state" in str(w.message) for w in caught)
    assert np.array_equal(safe.last_applied, [0.0])  # the safe action was the last command
    assert len(link.spool) > 0  # nothing was dropped: every batch waits for the learner


def test_drop_oldest_spool_keeps_the_actor_running_and_counts_losses():
    spool = Spool(disk_bytes=8_000, on_full="drop_oldest")
    link = connected_link(spool)
    device, task = envs.make("pendulum")
    loop = ActorLoop(device, task, UniformRandomPolicy(device.action_spec, seed=0), link,
                     ActorConfig(send_every=16, random_steps=10**9, realtime=True))
    with device:
        stats = loop.run(max_steps=150)
    assert stats.pauses == 0 and stats.env_steps == 150
    assert spool.dropped_batches > 0 and spool.bytes_total <= 8_000


class DyingLearner:
    """A learner server in a thread: grants plenty of credit, stores and acknowledges batches until
    ``dies_on(batch)``, then dies (no BYE, that batch never acknowledged); never, without it."""

    def __init__(self, port: int, committed: dict[int, int], dies_on=lambda batch: False):
        self.server = LearnerServer(f"tcp://127.0.0.1:{port}", run_id="r", incarnation=len(committed) + 1,
                                    committed_seq=lambda actor: committed.get(actor, 0))
        self.dies_on, self.committed, self.rows = dies_on, committed, 0
        self.died = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        granted = set()
        while not self._stop.is_set():
            for b in self.server.poll(10):
                if self.dies_on(b):
                    self.server.close()  # as SIGKILL: the batch in flight is never acknowledged
                    self.died.set()
                    return
                if b.seq > self.committed.get(b.session.actor_id, 0):
                    self.committed[b.session.actor_id] = b.seq
                    self.rows += len(b.steps)
                self.server.ack(b.session, b.seq)
            for identity, session in self.server.sessions.items():
                if identity not in granted:
                    self.server.grant(session, 100_000)
                    granted.add(identity)
            if self.server.sessions:
                self.server.heartbeat()

    def close(self):
        self._stop.set()
        self._thread.join(10)
        if not self.died.is_set():
            self.server.close()


def _actor(port: int, tmp_path, max_steps: int, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "embodyrl.cli", "actor", "pendulum", "--connect", f"tcp://127.0.0.1:{port}",
         "--index", "0", "--max-steps", str(max_steps), "--log-dir", str(tmp_path / "logs"),
         "--actor.spool_dir", str(tmp_path / "spool"), "--actor.flush_timeout_s", "2",
         "--actor.credit_timeout_s", "2", "--actor.random_steps", "100000", "--learner.peer_timeout_s", "1"],
        capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("when", ["mid_run", "on_the_last_batch"])
def test_an_actor_whose_learner_never_comes_back_exits_1_with_its_spool_count(tmp_path, when):
    """Mid-run the actor waits ``actor.credit_timeout_s`` for credit; with its steps done, its final
    flush waits ``actor.flush_timeout_s``. Either way it exits 1 naming what its spool holds."""
    port, committed = free_port(), {}
    dies_on = (lambda b: b.seq > 2) if when == "mid_run" else (lambda b: len(b.steps) < 64)  # the remainder
    learner = DyingLearner(port, committed, dies_on)
    try:
        done = _actor(port, tmp_path, max_steps=300)
    finally:
        learner.close()
    assert learner.died.is_set()
    ledger = read_ledger(tmp_path / "logs" / "actor-0.ledger.jsonl")
    spooled = {seq: rows for seq, (rows, _) in ledger.items() if seq > committed[0]}
    assert spooled, (committed, sorted(ledger))
    assert done.returncode == 1, done.stderr[-2000:]
    reason = "no credit from the learner" if when == "mid_run" else "actor.flush_timeout_s = 2"
    assert reason in done.stderr, done.stderr[-2000:]
    n = len(spooled)
    assert f"{sum(spooled.values())} rows in {n} batch{'es' if n != 1 else ''} unacknowledged" in done.stderr
    assert str(tmp_path / "spool" / "actor-0") in done.stderr and "delivers them" in done.stderr
    assert len(list((tmp_path / "spool" / "actor-0").glob("*.batch"))) == n

    learner = DyingLearner(port, committed)  # a learner there for good
    try:
        again = _actor(port, tmp_path, max_steps=0)  # restarted on the same spool: no new steps
    finally:
        learner.close()
    assert again.returncode == 0, again.stderr[-2000:]
    assert committed[0] == max(ledger) and learner.rows == sum(spooled.values())
    assert ledger_totals(tmp_path / "logs" / "actor-0.ledger.jsonl")[0] == sum(r for r, _ in ledger.values())
    assert not list((tmp_path / "spool" / "actor-0").glob("*.batch"))
