"""An actor process and a learner-side server exchange steps and weights on loopback."""

import multiprocessing as mp
import time

import numpy as np
import pytest
import zmq

from actor_helpers import run_actor
from embodyrl import envs
from embodyrl.hal.steps import PolicyVersion
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.client import LearnerLink, LinkError
from embodyrl.hal.wire.codec import encode
from embodyrl.transport import LearnerServer

INCARNATION = 12345


@pytest.fixture
def pendulum_specs():
    device, _ = envs.make("pendulum")
    return device.observation_spec, device.action_spec


@pytest.fixture
def server(pendulum_specs):
    obs_spec, act_spec = pendulum_specs

    def admit(devices):
        ok = all(d.observation_spec == obs_spec and d.action_spec == act_spec for d in devices)
        return None if ok else "wrong specs"

    s = LearnerServer(run_id="test", incarnation=INCARNATION, admit=admit, peer_timeout_s=20)
    yield s
    s.close()


@pytest.fixture
def spawn():
    ctx = mp.get_context("spawn")
    procs = []

    def start(target, *args):
        p = ctx.Process(target=target, args=args)
        p.start()
        procs.append(p)
        return p

    yield ctx, start
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)


def serve(server, until, deadline_s=60.0, on_batch=None, credits=64):
    """Run the learner side: ack batches, keep granting credits, until ``until()``."""
    deadline = time.monotonic() + deadline_s
    while not until():
        assert time.monotonic() < deadline, "learner side timed out"
        for b in server.poll(20):
            server.ack(b.session, b.seq, credits=len(b.steps))
            if on_batch:
                on_batch(b)
        for session in list(server.sessions.values()):
            if session.follower.held is not None and session.committed_seq == 0 and not getattr(session, "_granted", False):
                server.grant(session, credits)
                session._granted = True


def test_actor_process_streams_steps_and_follows_weights(server, spawn):
    ctx, start = spawn
    results = ctx.Queue()
    actor = start(run_actor, server.endpoint, 4, results)
    received = []
    server.publish(PolicyVersion(INCARNATION, 1), {"w": np.zeros((1, 3), np.float32)})

    def on_batch(batch):
        received.append(batch)
        rows = sum(len(b.steps) for b in received)
        version = 1 + rows // 300
        if version <= 4 and server.publisher.version.count < version:
            server.publish(PolicyVersion(INCARNATION, version), {"w": np.full((1, 3), 0.1 * version, np.float32)})

    serve(server, until=lambda: sum(b.steps.env_steps for b in received) >= 1500, on_batch=on_batch)
    server.bye("enough")
    serve(server, until=lambda: not actor.is_alive(), deadline_s=30)
    result = results.get(timeout=10)
    assert actor.exitcode == 0
    assert result["bye"] == "enough"
    assert result["version"] == [INCARNATION, 4]
    assert result["weight_updates"] >= 4
    np.testing.assert_allclose(result["w"], 0.4)
    steps_counts = np.concatenate([b.steps.policy_count[~b.steps.final] for b in received])
    assert np.all(np.diff(steps_counts) >= 0), "versions in the stream never go backwards"
    assert steps_counts[0] <= 1 and steps_counts[-1] == 4
    assert {int(a) for b in received for a in b.steps.actor_id} == {4}
    seqs = [b.seq for b in received]  # a run of batches a poll finds queued arrives as one, at its last seq
    assert seqs == sorted(set(seqs)) and seqs[0] >= 1
    assert server.stats.seq_gaps == 0  # none lost between them
    # the stream is consecutive within each episode, with one final row per finished episode
    episodes = np.concatenate([b.steps.episode_id for b in received])
    index = np.concatenate([b.steps.step_index for b in received])
    same = episodes[1:] == episodes[:-1]
    assert np.all(index[1:][same] == index[:-1][same] + 1)
    assert result["env_steps"] >= 1500


def test_actor_with_wrong_specs_is_refused(server, pendulum_specs):
    obs_spec, act_spec = pendulum_specs
    from embodyrl.hal.specs import ArraySpec

    wrong = P.DeviceInfo(0, "other", obs_spec, ArraySpec("action", (2,), np.float32, -1, 1))
    link = LearnerLink(server.endpoint, actor_name="x", actor_id=0, devices=[wrong], handshake_timeout_s=10)
    deadline = time.monotonic() + 10
    import threading

    done = threading.Event()

    def pump():
        while not done.is_set() and time.monotonic() < deadline:
            server.poll(20)

    t = threading.Thread(target=pump)
    t.start()
    try:
        with pytest.raises(LinkError, match="refused us: wrong specs"):
            link.connect()
    finally:
        done.set()
        t.join()
    assert server.stats.rejected.get("refused") == 1


def test_no_welcome_is_a_bounded_wait():
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        device, _ = envs.make("pendulum")
        info = P.DeviceInfo(0, "p", device.observation_spec, device.action_spec)
        link = LearnerLink(f"tcp://127.0.0.1:{port}", actor_name="x", actor_id=0, devices=[info],
                           handshake_timeout_s=0.5)
        start = time.monotonic()
        with pytest.raises(LinkError, match="no WELCOME"):
            link.connect()
        assert time.monotonic() - start < 3
    finally:
        silent.close(0)


def test_server_counts_garbage_and_keeps_serving(server):
    ctx = zmq.Context.instance()
    rogue = ctx.socket(zmq.DEALER)
    rogue.connect(server.endpoint)
    try:
        rogue.send_multipart([b"\x00\x01garbage"])
        rogue.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0}))  # before HELLO
        rogue.send_multipart(encode(P.HELLO, {"actor": 3}))  # malformed hello
        deadline = time.monotonic() + 5
        while sum(server.stats.rejected.values()) < 3 and time.monotonic() < deadline:
            server.poll(20)
        assert server.stats.rejected == {"header_malformed": 1, "unknown_peer": 1, "field_type": 1}
    finally:
        rogue.close(0)


def test_credit_goes_round_the_actors_when_there_is_room_for_one_quantum_at_a_time():
    from types import SimpleNamespace

    from embodyrl.transport.credits import CreditBook

    sessions = {i: SimpleNamespace(identity=i, devices={0: None}) for i in (b"a", b"b", b"c")}
    book, served = CreditBook(), []
    for _ in range(6):  # each round: one quantum, spent before the next round
        identity = book.order(sessions)[0].identity
        served.append(identity)
        book.granted(identity, 256)
        book.spent(identity, 256)
    assert served == [b"a", b"b", b"c", b"a", b"b", b"c"]
    book.granted(b"b", 256)  # holding credit: served after those with none
    assert [s.identity for s in book.order(sessions)] == [b"a", b"c", b"b"]
    assert book.outstanding() == 256
    book.forget(b"b")  # a session gone: its credit with it
    assert book.outstanding() == 0 and book.held(b"b") == 0


def test_the_server_keeps_each_sessions_credit_and_forgets_it_with_the_session(server, pendulum_specs):
    import threading

    from embodyrl.hal.wire.protocol import DeviceInfo

    link = LearnerLink(server.endpoint, actor_name="a", actor_id=4,
                       devices=[DeviceInfo(0, "pendulum", *pendulum_specs)])
    thread = threading.Thread(target=link.connect)
    thread.start()
    deadline = time.monotonic() + 20
    while (not server.sessions or thread.is_alive()) and time.monotonic() < deadline:
        server.poll(20)
    thread.join(10)
    session = next(iter(server.sessions.values()))
    server.grant(session, 64)
    server.ack(session, 0, credits=32)
    assert server.credits.held(session.identity) == 96 and server.credits.outstanding() == 96
    server.credits.spent(session.identity, 100)  # overspent: counts nothing outstanding
    assert server.credits.outstanding() == 0
    link.close()
    deadline = time.monotonic() + 20
    while server.sessions and time.monotonic() < deadline:  # its BYE ends the session
        server.poll(20)
    assert not server.sessions and server.credits.held(session.identity) == 0
