"""A real-time actor never blocks on a dead learner: it spools, then pauses its devices safely.
An actor whose learner never comes back exits non-zero, saying what its spool still holds; a
restart on the same spool delivers it."""

import subprocess
import sys
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
from embodyrl.learner.testing import ServedLearner


def connected_link(spool, tmp_path, peer_timeout_s=0.5):
    device, _ = envs.make("pendulum")
    learner = ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="r", incarnation=1)
    info = P.DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink(learner.endpoint, actor_name="rt", actor_id=0, devices=[info], handshake_timeout_s=5,
                       peer_timeout_s=peer_timeout_s, spool=spool)
    link.connect()
    learner.kill()  # the learner dies right after the handshake
    return link


def test_realtime_actor_keeps_its_rate_then_pauses_safely_when_the_spool_fills(tmp_path):
    link = connected_link(Spool(disk_bytes=8_000), tmp_path)  # room for a few batches only
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


def test_drop_oldest_spool_keeps_the_actor_running_and_counts_losses(tmp_path):
    spool = Spool(disk_bytes=8_000, on_full="drop_oldest")
    link = connected_link(spool, tmp_path)
    device, task = envs.make("pendulum")
    loop = ActorLoop(device, task, UniformRandomPolicy(device.action_spec, seed=0), link,
                     ActorConfig(send_every=16, random_steps=10**9, realtime=True))
    with device:
        stats = loop.run(max_steps=150)
    assert stats.pauses == 0 and stats.env_steps == 150
    assert spool.dropped_batches > 0 and spool.bytes_total <= 8_000


def dying_learner(port: int, tmp_path, incarnation: int, dies_on=None) -> ServedLearner:
    """The real learner on ``port`` over the replay in ``tmp_path``: it dies (no BYE, that batch never
    stored or acknowledged) when ``dies_on(batch)``; a restart reopens the replay and its seqs."""
    return ServedLearner(tmp_path / "learner", envs.layout("pendulum"), endpoint=f"tcp://127.0.0.1:{port}",
                         run_id="r", incarnation=incarnation, dies_on=dies_on)


def committed(learner: ServedLearner, actor_id: int = 0) -> int:
    """The newest seq of ``actor_id`` the learner's replay has made durable."""
    return learner.read(lambda service: service.data.committed_seq(actor_id))


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
    port = free_port()
    dies_on = (lambda b: b.seq > 2) if when == "mid_run" else (lambda b: len(b.steps) < 64)  # the remainder
    learner = dying_learner(port, tmp_path, 1, dies_on)
    try:
        # mid-run: more steps than a learner dead at its third batch can have granted credit for, so the
        # actor runs out of credit whatever the timing (with 300 it could hold credit for them all)
        done = _actor(port, tmp_path, max_steps=5000 if when == "mid_run" else 300)
    finally:
        learner.close()
    assert learner.died
    ledger = read_ledger(tmp_path / "logs" / "actor-0.ledger.jsonl")
    learner = dying_learner(port, tmp_path, 2)  # a learner there for good, over the same replay
    try:
        durable = committed(learner)  # what the first made durable before it died
        lost = {seq: rows for seq, (rows, _) in ledger.items() if seq > durable}  # only the spool has them
        assert lost, (durable, sorted(ledger))
        # the spool holds every unacknowledged batch: those beyond the durable ones, and any made
        # durable whose ACK the death cut off (the restart resends it; the learner drops it)
        spooled = {int(path.stem): ledger[int(path.stem)][0]
                   for path in (tmp_path / "spool" / "actor-0").glob("*.batch")}
        assert set(lost) <= set(spooled)
        assert done.returncode == 1, done.stderr[-2000:]
        reason = "no credit from the learner" if when == "mid_run" else "actor.flush_timeout_s = 2"
        assert reason in done.stderr, done.stderr[-2000:]
        n = len(spooled)
        assert f"{sum(spooled.values())} rows in {n} batch{'es' if n != 1 else ''} unacknowledged" in done.stderr
        assert str(tmp_path / "spool" / "actor-0") in done.stderr and "delivers them" in done.stderr
        again = _actor(port, tmp_path, max_steps=0)  # restarted on the same spool: no new steps
        assert again.returncode == 0, again.stderr[-2000:]
        # it also sends, as new batches, the rows its predecessor recorded and never batched (its journal:
        # mid-run, those waiting for credit when the wait ran out)
        journaled = {seq: rows for seq, (rows, _) in read_ledger(tmp_path / "logs" / "actor-0.ledger.jsonl").items()
                     if seq > max(ledger)}
        assert bool(journaled) == (when == "mid_run"), journaled
        assert committed(learner) == max(ledger) + len(journaled)
        assert learner.rows == sum(lost.values()) + sum(journaled.values())
    finally:
        learner.close()
    assert ledger_totals(tmp_path / "logs" / "actor-0.ledger.jsonl")[0] == sum(r for r, _ in ledger.values()) + \
        sum(journaled.values())
    assert not list((tmp_path / "spool" / "actor-0").glob("*.batch"))
