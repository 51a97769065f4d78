"""Exactly once across a learner restart and an actor restart (kill -9), on real sockets: every row
an actor's ledger names (:mod:`embodyrl.hal.ledger`) reaches the learner once."""

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from embodyrl import envs
from embodyrl.bench.chaos_parts import free_port, ledger_actor
from embodyrl.hal.ledger import DIGEST_MOD, ledger_totals, read_ledger
from embodyrl.hal.steps import rows_digest
from embodyrl.learner.testing import ServedLearner


def served(tmp_path, port: int, incarnation: int) -> ServedLearner:
    """The real learner on ``port``; a restart over the same directory reopens its replay and seqs."""
    return ServedLearner(tmp_path / "learner", envs.layout("pendulum"), endpoint=f"tcp://127.0.0.1:{port}",
                         run_id="r", incarnation=incarnation, peer_timeout_s=5)


def kept(batches) -> tuple[list[tuple[int, int]], int]:
    """(episode id, step index) of every row in ``batches``, and their digest."""
    rows = [row for t in batches for row in zip(t.steps.episode_id.tolist(), t.steps.step_index.tolist(), strict=True)]
    return rows, sum(rows_digest(t.steps) for t in batches) % DIGEST_MOD


@pytest.fixture
def ctx():
    context = mp.get_context("spawn")
    procs = []
    yield context, procs
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)


def test_learner_restart_loses_and_duplicates_nothing(tmp_path, ctx):
    context, procs = ctx
    port = free_port()
    first = served(tmp_path, port, 1)
    log = tmp_path / "ledger.jsonl"
    actor = context.Process(target=ledger_actor,
                            args=(f"tcp://127.0.0.1:{port}", 1, str(tmp_path / "spool"), str(log), 3000))
    actor.start()
    procs.append(actor)
    assert first.wait(lambda service: service.counters.rows > 0, timeout_s=60), "nothing arrived before the crash"
    time.sleep(2.0)
    first.kill()  # no BYE, no last commit: in-flight and uncommitted rows are lost to it
    time.sleep(3.0)  # the actor keeps stepping and spools; then notices the silence
    second = served(tmp_path, port, 2)
    try:
        durable = second.read(lambda service: service.data.committed_seq(1))
        deadline = time.monotonic() + 90
        while actor.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert actor.exitcode == 0
        stored = second.read(lambda service: service.data.replay.size)
    finally:
        second.close()
    rows, digest = kept([t for t in first.taken if t.seq <= durable] + second.taken)  # what the replay holds
    assert len(rows) == stored
    assert ledger_totals(log)[0] >= 3000
    assert len(rows) == len(set(rows)), "duplicates reached the learner"
    assert (len(rows), digest) == ledger_totals(log)


def test_actor_killed_and_restarted_resends_its_spool(tmp_path, ctx):
    context, procs = ctx
    port = free_port()
    learner = served(tmp_path, port, 1)
    log = tmp_path / "ledger.jsonl"
    args = (f"tcp://127.0.0.1:{port}", 2, str(tmp_path / "spool"), str(log))
    first = context.Process(target=ledger_actor, args=(*args, 100_000))
    first.start()
    procs.append(first)
    try:
        # a spawned actor may take seconds to import on a loaded machine
        assert learner.wait(lambda service: service.counters.rows > 0, timeout_s=60)
        time.sleep(2.0)
        # the learner stalls (a long update, say): what the actor sends meanwhile waits unacknowledged
        stall = threading.Thread(target=learner.read, args=(lambda service: time.sleep(2.5),))
        stall.start()
        time.sleep(1.5)
        taken_before_kill = max(t.seq for t in learner.taken)
        os.kill(first.pid, signal.SIGKILL)
        first.join(10)
        stall.join()
        lost_in_transit = set(read_ledger(log)) - set(range(1, taken_before_kill + 1))
        assert lost_in_transit, "the kill should leave unacknowledged batches in the spool"
        second = context.Process(target=ledger_actor, args=(*args, 500))
        second.start()
        procs.append(second)
        deadline = time.monotonic() + 90
        while second.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert second.exitcode == 0
    finally:
        learner.close()
    rows, digest = kept(learner.taken)
    assert len(rows) == len(set(rows)), "duplicates reached the learner"
    assert (len(rows), digest) == ledger_totals(log)
    assert max(lost_in_transit) <= max(t.seq for t in learner.taken)


def test_a_spool_of_one_run_is_kept_when_its_address_now_serves_another(tmp_path):
    """Another run's learner on the old address has acknowledged higher seqs of the same actor id:
    its WELCOME must not delete, as acknowledged, batches it never took."""
    from embodyrl.hal.actor import ActorConfig, ActorLoop
    from embodyrl.hal.policy import UniformRandomPolicy
    from embodyrl.hal.wire.client import HandshakeFailed, LearnerLink
    from embodyrl.hal.wire.protocol import DeviceInfo
    from embodyrl.hal.wire.spool import Spool

    device, task = envs.make("pendulum")
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)

    def link(endpoint, spool, taken=None):
        return LearnerLink(endpoint, actor_name="a7", actor_id=7, devices=[info], handshake_timeout_s=20,
                           spool=spool, on_sent=None if taken is None else lambda seq, steps: taken.append(steps))

    def act(link, steps):
        ActorLoop(device, task, UniformRandomPolicy(device.action_spec, seed=0), link,
                  ActorConfig(actor_id=7, send_every=16, random_steps=10**9, seed=0)).run(max_steps=steps)
        assert link.flush(30)

    port = free_port()
    with device, ServedLearner(tmp_path / "b", envs.layout("pendulum"), run_id="run-b", incarnation=2) as b:
        first = link(b.endpoint, Spool())
        first.connect()
        act(first, 80)  # run b holds actor 7's seqs 1..5
        first.close()
        a = ServedLearner(tmp_path / "a", envs.layout("pendulum"), endpoint=f"tcp://127.0.0.1:{port}",
                          run_id="run-a", incarnation=1)
        taken, spool = [], Spool(tmp_path / "spool")
        ours = link(a.endpoint, spool, taken)
        ours.connect()
        act(ours, 32)  # seqs 1, 2: acknowledged by run a
        a.kill()
        for steps in list(taken):  # seqs 3, 4: in the spool only
            ours.send_steps(0, steps)
        ours.close(send_bye=False)
        assert Spool(tmp_path / "spool").seqs() == [3, 4]
        again = link(b.endpoint, Spool(tmp_path / "spool"))
        with pytest.raises(HandshakeFailed, match="run 'run-b'.*32 rows for run 'run-a'"):
            again.connect()
        kept_spool = Spool(tmp_path / "spool")
        assert kept_spool.seqs() == [3, 4] and kept_spool.rows == 32 and kept_spool.run == "run-a"
        assert b.read(lambda service: service.data.committed_seq(7)) == 5 and b.rows == 80
