"""The link keeps one socket through learner stalls and restarts, so every WELCOME, ACK and credit
the learner sends reaches it; its final flush outlasts a slow learner restart and, when it gives
up, says what its spool still holds. Real sockets, the real learner service (no training) and a
LearnerLink."""

import threading
import time

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.bench.chaos_parts import bound_when_free, free_port
from embodyrl.hal.steps import NO_POLICY, PolicyVersion, StepRecorder, Steps
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.client import LearnerLink, Undelivered
from embodyrl.hal.wire.spool import Spool
from embodyrl.learner.testing import ServedLearner
from embodyrl.transport import LearnerServer
from embodyrl.transport.credits import grant_in_turn
from embodyrl.transport.server import UNSENT

DEVICE, _ = envs.make("pendulum")
LAYOUT = envs.layout("pendulum")
INFO = P.DeviceInfo(0, "pendulum", DEVICE.observation_spec, DEVICE.action_spec)


RECORDER = StepRecorder(DEVICE.observation_spec, DEVICE.action_spec, actor_id=0, device_id=0, capacity=64)


def batch(n: int) -> Steps:
    """``n`` pendulum rows (each call's rows are new ones)."""
    spec = DEVICE.observation_spec
    observation, action = {k: np.zeros(spec[k].shape, spec[k].dtype) for k in spec}, np.zeros(1, np.float32)
    for _ in range(n):
        RECORDER.add(observation, action, action, 0.0, False, False, NO_POLICY)
    return RECORDER.flush()


class Learner:
    """The real learner service on a fixed port (:class:`ServedLearner`), restartable over the same
    replay: a restart reopens it and resumes each actor's seq from what it committed."""

    def __init__(self, port: int, directory):
        self.port, self.directory = port, directory
        self.served: ServedLearner | None = None
        self.send_failed = self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.served = bound_when_free(lambda: ServedLearner(
            self.directory, LAYOUT, endpoint=f"tcp://127.0.0.1:{self.port}", run_id="r", incarnation=self.starts))

    def read(self, question):
        return self.served.read(question)

    def crash(self) -> None:
        self.send_failed += self.read(lambda s: sum(s.server.stats.rejected.get(r, 0) for r in UNSENT))
        self.served.kill()  # as SIGKILL: no BYE, nothing more committed or acknowledged
        self.served = None

    def stall(self, seconds: float) -> threading.Thread:
        """The service's loop stops for ``seconds`` (a long compile, say): nothing is taken or answered."""
        thread = threading.Thread(target=self.read, args=(lambda s: time.sleep(seconds),), daemon=True)
        thread.start()
        return thread

    def held(self, actor_id: int = 0) -> int:
        """The newest seq of ``actor_id`` the replay has committed."""
        return self.read(lambda s: s.data.committed_seq(actor_id))

    def failed_sends(self) -> int:
        now = self.read(lambda s: sum(s.server.stats.rejected.get(r, 0) for r in UNSENT)) if self.served else 0
        return self.send_failed + now


def pump(link: LearnerLink, until, timeout_s: float = 10.0) -> bool:
    """Poll ``link`` until ``until()`` holds or the time is up."""
    deadline = time.monotonic() + timeout_s
    while not until() and time.monotonic() < deadline:
        link.poll(5)
    return until()


def make_link(port: int, spool: Spool | None = None, **kwargs) -> LearnerLink:
    options = {"handshake_timeout_s": 5, "heartbeat_s": 0.05, "reconnect_s": 0.05, "reconnect_max_s": 0.2, **kwargs}
    return LearnerLink(f"tcp://127.0.0.1:{port}", actor_name="a", actor_id=0, devices=[INFO],
                       spool=spool, **options)


def connect(learner: Learner, link: LearnerLink) -> None:
    link.connect()


def acked_once(tmp_path) -> tuple[Learner, LearnerLink]:
    """A learner on a free port and a link whose first batch of 16 rows it has acknowledged."""
    learner = Learner(free_port(), tmp_path / "learner")
    learner.start()
    link = make_link(learner.port, peer_timeout_s=30.0)
    connect(learner, link)
    link.send_steps(0, batch(16))
    assert pump(link, lambda: link.acked_seq == 1)
    return learner, link


def test_every_reply_reaches_the_link_through_a_learner_stall(tmp_path):
    """The learner's loop stalls (a long compile) past the link's patience: the link says HELLO
    again, on the same connection. When the learner comes back it answers every HELLO and acks
    the batches it took on the earlier session: all of it reaches the link, nothing is sent to a
    connection the link abandoned (the old link redialled on a fresh socket each backoff step:
    its WELCOMEs and those ACKs went to dead identities, the learner's ``send_failed``)."""
    learner = Learner(free_port(), tmp_path / "learner")
    learner.start()
    link = make_link(learner.port, peer_timeout_s=0.3)
    connect(learner, link)
    assert pump(link, lambda: link.credits >= 256)
    link.send_steps(0, batch(32))
    assert pump(link, lambda: link.acked_seq == 1)
    stall_end = time.monotonic() + 2.0
    stall = learner.stall(2.0)
    time.sleep(0.05)  # the service is in its stall
    for _ in range(3):  # sent into the stalled learner's queue: taken on this session, acked after the stall
        link.send_steps(0, batch(32))
    while time.monotonic() < stall_end - 0.3:  # the link's patience is 0.3 s
        link.poll(10)
    assert link.stats.reconnects >= 1 and not link.connected  # it noticed the silence
    stall.join()
    assert pump(link, lambda: link.connected and not len(link.spool))
    assert learner.held() == 4
    assert learner.failed_sends() == 0, learner.read(lambda s: s.server.stats.rejected)
    learner.read(lambda s: s.server.heartbeat())
    time.sleep(0.05)
    link.poll(5)
    assert link.connected and learner.failed_sends() == 0
    link.close()
    learner.crash()


def test_a_restarted_learner_is_greeted_as_soon_as_it_listens(tmp_path):
    """The connection's drop tells the link its session is gone: it says HELLO on the next
    connection at once, not after ``peer_timeout_s`` of silence."""
    learner, link = acked_once(tmp_path)
    learner.crash()
    link.send_steps(0, batch(16))  # spooled while the learner is down
    for _ in range(20):
        link.poll(10)
    assert not link.connected
    learner.start()
    started = time.monotonic()
    assert pump(link, lambda: link.acked_seq == 2, timeout_s=10)
    assert time.monotonic() - started < 3.0
    assert link.stats.reconnects == 1 and learner.failed_sends() == 0
    link.close()
    learner.crash()


def test_a_learner_stopped_before_its_budget_says_so_and_its_actors_dial_its_restart(tmp_path):
    """A learner stopped cleanly (Ctrl-C) before its budget commits, acks and says BYE with
    ``restart``: the link keeps its spool and greets the learner started again on the same port,
    which takes the rows spooled meanwhile. Only a BYE without it (the run complete) ends the link."""
    learner, link = acked_once(tmp_path)
    closing = threading.Thread(target=learner.served.close, kwargs={"restart": True})
    closing.start()  # the link is polled meanwhile, as an actor's loop polls it
    assert pump(link, lambda: not link.connected, timeout_s=5)
    closing.join()
    assert link.bye_reason is None
    link.send_steps(0, batch(16))  # spooled while the learner is down
    learner.start()
    assert pump(link, lambda: link.acked_seq == 2, timeout_s=10)
    assert link.bye_reason is None and learner.read(lambda s: s.server.stats.duplicates) == 0
    closing = threading.Thread(target=learner.served.close)  # the run complete: goodbye
    closing.start()
    assert pump(link, lambda: link.bye_reason is not None, timeout_s=5)
    closing.join()
    assert link.bye_reason == "the test is over"
    link.close()


def test_the_final_flush_outlasts_a_slow_restart_and_says_what_it_gives_up(tmp_path):
    """The failure this fixes: the actor's last batch was spooled when the learner was SIGKILLed,
    and its final flush gave up before the restarted learner listened; the process exited 0."""
    learner = Learner(free_port(), tmp_path / "learner")
    learner.start()
    spool = Spool(tmp_path / "spool")
    link = make_link(learner.port, spool, peer_timeout_s=0.5)
    connect(learner, link)
    link.send_steps(0, batch(30))
    assert pump(link, lambda: link.acked_seq == 1)
    learner.crash()
    link.send_steps(0, batch(35))
    with pytest.raises(Undelivered) as gave_up:  # the learner stays away
        link.drain(0.5)
    assert (gave_up.value.rows, gave_up.value.batches) == (35, 1)
    message = str(gave_up.value)
    assert "35 rows in 1 batch unacknowledged" in message and str(tmp_path / "spool") in message
    assert "restarted on it" in message
    restarted, stop = threading.Event(), threading.Event()

    def restart_late():  # later than the old 10 s default would allow, scaled down
        time.sleep(1.5)
        learner.start()
        restarted.set()

    thread = threading.Thread(target=restart_late, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        link.drain(30.0)
    finally:
        stop.set()
        thread.join()
    assert restarted.is_set() and time.monotonic() - started >= 1.0
    assert learner.held() == 2 and not len(spool)
    assert learner.failed_sends() == 0
    link.close()
    learner.crash()


def test_a_memory_spool_says_its_rows_are_lost(tmp_path):
    learner = Learner(free_port(), tmp_path / "learner")
    learner.start()
    link = make_link(learner.port)
    connect(learner, link)
    learner.crash()
    link.send_steps(0, batch(7))
    link.send_steps(0, batch(5))
    with pytest.raises(Undelivered, match="12 rows in 2 batches unacknowledged; the spool is in memory only"):
        link.drain(0.2)
    link.close()


def test_weights_version_is_kept_across_a_reconnect(tmp_path):
    """The HELLO after a reconnect names the weights the link holds, so the learner sends a delta
    or nothing rather than full weights again."""
    learner = Learner(free_port(), tmp_path / "learner")
    learner.start()
    link = make_link(learner.port)
    connect(learner, link)
    learner.read(lambda s: s.server.publish(PolicyVersion(1, 1), {"w": np.ones(4, np.float32)}))
    assert pump(link, lambda: link.held_version == PolicyVersion(1, 1))
    learner.crash()
    for _ in range(10):
        link.poll(10)
    learner.start()
    assert pump(link, lambda: link.connected)
    assert learner.read(lambda s: [x.follower.held for x in s.server.sessions.values()]) == [PolicyVersion(1, 1)]
    link.close()
    learner.crash()


def test_a_closed_link_says_goodbye_and_a_vanished_one_costs_no_failed_reply():
    """A link's BYE leaves before its socket closes (linger 0 could drop it): the learner ends the
    session at once. A link that vanishes without one (killed) leaves its session until silence
    times it out; a heartbeat to it is ``peer_gone``, not a failed reply (``send_failed``, which
    would mean a WELCOME or ACK sent to the wrong connection). What the server counts is under
    test, so the server is stepped by hand here, heartbeats and all."""
    server = LearnerServer(run_id="r", incarnation=1)

    def step(timeout_ms: int = 5) -> None:
        for b in server.poll(timeout_ms):
            server.ack(b.session, b.seq)
        grant_in_turn(server, 256, lambda outstanding: True)

    def connected(link: LearnerLink) -> None:
        stop = threading.Event()
        thread = threading.Thread(target=lambda: [step() for _ in iter(stop.is_set, True)], daemon=True)
        thread.start()
        try:
            link.connect()
        finally:
            stop.set()
            thread.join()

    port = int(server.endpoint.rsplit(":", 1)[1])
    try:
        polite = make_link(port)
        connected(polite)
        assert len(server.sessions) == 1
        polite.close()
        deadline = time.monotonic() + 5
        while server.sessions and time.monotonic() < deadline:
            step()
        assert not server.sessions

        killed = make_link(port)
        connected(killed)
        session = next(iter(server.sessions.values()))
        killed.close(send_bye=False)  # as SIGKILL: no goodbye
        deadline = time.monotonic() + 5
        while not server.stats.rejected and time.monotonic() < deadline:
            step(20)  # until the learner sees the connection gone
            server.heartbeat()
        assert server.stats.rejected == {"peer_gone": 1} and server.sessions
        server.grant(session, 8)  # a reply to it does count as failed
        assert server.stats.rejected == {"peer_gone": 1, "send_failed": 1}
    finally:
        server.close()


def test_an_actor_welcomed_as_its_learner_says_goodbye_ends_without_an_error():
    """A learner at its step budget keeps serving for a moment to say goodbye, and tells a session that
    begins meanwhile too: the WELCOME and the BYE reach the link together. It connected, and stops on
    the goodbye (an actor of ``train`` that started late once failed the whole run here). The BYE may
    follow the WELCOME in a later read, so the link polls for it as the actor's loop does."""
    server = LearnerServer("tcp://127.0.0.1:*", run_id="r", incarnation=1)
    early = LearnerLink(server.endpoint, actor_name="early", actor_id=1, devices=[INFO], handshake_timeout_s=10)
    answering = threading.Thread(target=early.connect)
    answering.start()
    while not server.sessions:
        server.poll(20)
    answering.join(10)
    # the early actor does not answer the goodbye (it is busy), so the learner keeps serving a while
    saying = threading.Thread(target=server.bye, args=("training complete",), kwargs={"wait_s": 5.0})
    saying.start()
    link = LearnerLink(server.endpoint, actor_name="late", actor_id=0, devices=[INFO], handshake_timeout_s=10)
    try:
        link.connect()
        deadline = time.monotonic() + 5
        while link.bye_reason is None and time.monotonic() < deadline:
            link.poll(20)
        assert link.bye_reason == "training complete"
    finally:
        link.close()
        early.close(send_bye=False)
        saying.join(10)
        server.close()
