"""Exactly once across a learner restart and an actor restart (kill -9), on real sockets: every row
an actor's ledger names (:mod:`embodyrl.hal.ledger`) reaches the learner once."""

import multiprocessing as mp
import os
import signal
import socket
import time

import pytest

from embodyrl.bench.chaos_parts import ledger_actor
from embodyrl.hal.ledger import DIGEST_MOD, ledger_totals, read_ledger
from embodyrl.hal.steps import rows_digest
from embodyrl.transport import LearnerServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DurableLearnerSide:
    """What the learner keeps across restarts: the rows it committed and each actor's last seq."""

    def __init__(self):
        self.rows: list[tuple[int, int]] = []  # (episode id, step index) of every row taken
        self.digest = 0  # of every row taken (the ledger's digest, if each arrived once)
        self.committed: dict[int, int] = {}
        self.received: dict[int, int] = {}
        self.server: LearnerServer | None = None

    def start(self, port: int):
        self.server = LearnerServer(f"tcp://127.0.0.1:{port}", run_id="r", incarnation=len(self.committed) + 1,
                                    committed_seq=lambda actor: self.committed.get(actor, 0),
                                    peer_timeout_s=5)

    def crash(self):
        self.server.close()  # no BYE, in-flight messages lost
        self.server = None

    def serve(self, seconds: float, accept=lambda batch: True):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for b in self.server.poll(20):
                if not accept(b):
                    continue  # as if it never arrived
                if b.seq <= self.received.get(b.session.actor_id, 0):
                    continue  # a resend of what this side already holds, as the real learner drops it
                self.received[b.session.actor_id] = b.seq
                self.rows += list(zip(b.steps.episode_id.tolist(), b.steps.step_index.tolist(), strict=True))
                self.digest = (self.digest + rows_digest(b.steps)) % DIGEST_MOD
                self.committed[b.session.actor_id] = b.seq
                self.server.ack(b.session, b.seq, credits=len(b.steps))
            for session in self.server.sessions.values():
                if not getattr(session, "granted", False):
                    self.server.grant(session, 256)
                    session.granted = True


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
    learner = DurableLearnerSide()
    learner.start(port)
    log = tmp_path / "ledger.jsonl"
    actor = context.Process(target=ledger_actor,
                            args=(f"tcp://127.0.0.1:{port}", 1, str(tmp_path / "spool"), str(log), 3000))
    actor.start()
    procs.append(actor)
    learner.serve(4.0)
    assert learner.rows, "nothing arrived before the crash"
    learner.crash()
    time.sleep(3.0)  # the actor keeps stepping and spools; then notices the silence
    learner.start(port)
    deadline = time.monotonic() + 90
    while actor.is_alive() and time.monotonic() < deadline:
        learner.serve(0.5)
    assert actor.exitcode == 0
    rows, digest = ledger_totals(log)
    assert rows >= 3000
    assert len(learner.rows) == len(set(learner.rows)), "duplicates reached the learner"
    assert (len(learner.rows), learner.digest) == (rows, digest)


def test_actor_killed_and_restarted_resends_its_spool(tmp_path, ctx):
    context, procs = ctx
    port = free_port()
    learner = DurableLearnerSide()
    learner.start(port)
    log = tmp_path / "ledger.jsonl"
    args = (f"tcp://127.0.0.1:{port}", 2, str(tmp_path / "spool"), str(log))
    first = context.Process(target=ledger_actor, args=(*args, 100_000))
    first.start()
    procs.append(first)
    deadline = time.monotonic() + 60  # a spawned actor may take seconds to import on a loaded machine
    while 2 not in learner.received and time.monotonic() < deadline:
        learner.serve(0.5)
    learner.serve(2.0)
    # from now on the learner "loses" what arrives: it stays in the actor's spool
    learner.serve(1.5, accept=lambda b: False)
    os.kill(first.pid, signal.SIGKILL)
    first.join(10)
    lost_in_transit = set(read_ledger(log)) - set(range(1, learner.received[2] + 1))
    assert lost_in_transit, "the kill should leave unacknowledged batches in the spool"
    second = context.Process(target=ledger_actor, args=(*args, 500))
    second.start()
    procs.append(second)
    deadline = time.monotonic() + 90
    while second.is_alive() and time.monotonic() < deadline:
        learner.serve(0.5)
    assert second.exitcode == 0
    rows, digest = ledger_totals(log)
    assert len(learner.rows) == len(set(learner.rows)), "duplicates reached the learner"
    assert (len(learner.rows), learner.digest) == (rows, digest)
    assert max(lost_in_transit) <= learner.received[2]
