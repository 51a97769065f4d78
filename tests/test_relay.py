"""A relay between the learner and the actors of one host: every row arrives once, every publication
crosses from the learner once and reaches every actor bit for bit, and the actors cannot tell."""

import threading
import time

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.bench.chaos_parts import bound_when_free
from embodyrl.hal.steps import PolicyVersion, StepRecorder
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire import weights as W
from embodyrl.hal.wire.client import HandshakeFailed, LearnerLink
from embodyrl.hal.wire.codec import encode
from embodyrl.hal.wire.security import ClientKeys, ServerKeys, generate_keys
from embodyrl.learner.testing import ServedLearner
from embodyrl.transport.relay import Relay

INCARNATION = 5


@pytest.fixture(scope="module")
def pendulum():
    device, _ = envs.make("pendulum")
    return P.DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)


def tree(rng):
    return {"actor/w": rng.normal(size=(256, 256)).astype(np.float32), "actor/b": np.zeros(256, np.float32)}


def sparse_step(weights, rng):
    out = {k: v.copy() for k, v in weights.items()}
    flat = out["actor/w"].reshape(-1)
    flat[rng.choice(flat.size, flat.size // 100, replace=False)] += np.float32(1e-3)
    return out


def batch(info, actor_id: int, rows: int = 16):
    recorder = StepRecorder(info.observation_spec, info.action_spec, actor_id=actor_id, device_id=0, capacity=rows)
    observation = {k: np.zeros(s.shape, s.dtype) for k, s in info.observation_spec.items()}
    action = np.zeros(info.action_spec.shape, info.action_spec.dtype)
    for _ in range(rows):
        recorder.add(observation, action, action, 0.0, False, False, PolicyVersion(0, -1))
    return recorder.flush()


def _bound(*args, **kwargs) -> Relay:
    """A relay on its address once the port is free (a restarted relay, in this process)."""
    return bound_when_free(lambda: Relay(*args, **kwargs))


class RelayThread:
    """A relay polled in a thread of its own (its sockets live there), as ``embodyrl relay`` runs it."""

    def __init__(self, *args, **kwargs):
        self.relay: Relay | None = None
        self._ready, self._stop, self._error = threading.Event(), threading.Event(), []
        self._thread = threading.Thread(target=self._run, args=args, kwargs=kwargs, daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error:
            raise RuntimeError(f"the relay did not start: {self._error}")

    def _run(self, *args, **kwargs) -> None:
        try:
            self.relay = _bound(*args, **kwargs)
            self.relay.connect()
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            self._error.append(err)
            self._ready.set()
            return
        self._ready.set()
        try:
            self.relay.run(self._stop.is_set)
        finally:
            self.relay.close()

    @property
    def endpoint(self) -> str:
        return self.relay.endpoint

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def pump(links, until, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for link in links:
            link.poll(2)
        if until():
            return
    raise AssertionError("timed out")


def actors(endpoint, info, n, **kwargs):
    links = [LearnerLink(endpoint, actor_name=f"a{i}", actor_id=i, devices=[info], handshake_timeout_s=20,
                         heartbeat_s=0.05, **kwargs) for i in range(n)]
    for link in links:
        link.connect()
    return links


def test_actors_behind_a_relay_store_every_row_once_and_get_each_publication_from_it(tmp_path, pendulum):
    rng = np.random.default_rng(0)
    weights = tree(rng)
    with ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="r", incarnation=INCARNATION,
                       weights=weights) as learner:
        relay = RelayThread(learner.endpoint, "tcp://127.0.0.1:*", name="rack-1")
        links = actors(relay.endpoint, pendulum, 3)
        try:
            for round_ in range(3):
                for link in links:
                    link.send_steps(0, batch(pendulum, link.actor_id))
                pump(links, lambda: all(link.unacked_rows == 0 for link in links))
                weights = sparse_step(weights, rng)
                version = PolicyVersion(INCARNATION, round_ + 2)  # the learner published count 1 at its start
                learner.read(lambda service, v=version, w=weights: service.server.publish(v, w))
                pump(links, lambda v=version: all(link.held_version == v for link in links))
                for link in links:
                    got = link.take_weights()
                    assert got[0] == version and W.checksum(got[1]) == W.checksum(weights)
            assert learner.read(lambda service: service.counters.rows) == 3 * 3 * 16
            sessions = learner.read(lambda service: [(s.actor_id, s.relay, s.relayed_by)
                                                     for s in service.server.sessions.values()])
            assert sorted(sessions) == [(P.relay_id(0), True, None), (0, False, "rack-1"), (1, False, "rack-1"),
                                        (2, False, "rack-1")]
            # the learner sent each publication once, to the relay: four (the first, full, and three)
            sent = learner.read(lambda service: dict(service.server.publisher.sent))
            assert sum(sent.values()) == 4, sent
            # the relay sent each to three actors, as deltas where they pay, as the learner would
        finally:
            for link in links:
                link.close()
            relay.stop()
        stats, sent = relay.relay.stats, relay.relay.publisher.sent
        assert stats.weights_sent == 12 and sent.get("delta", 0) == 9, sent


def test_a_restarted_relay_loses_no_row_and_its_actors_dial_it_again(tmp_path, pendulum):
    with ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="r", incarnation=INCARNATION,
                       weights=tree(np.random.default_rng(1))) as learner:
        relay = RelayThread(learner.endpoint, "tcp://127.0.0.1:*", peer_timeout_s=2)
        endpoint = relay.endpoint
        links = actors(endpoint, pendulum, 2, peer_timeout_s=1)
        try:
            for link in links:
                link.send_steps(0, batch(pendulum, link.actor_id))
            relay.stop()  # gone at once: what it held is lost; the actors spool meanwhile
            for link in links:
                link.send_steps(0, batch(pendulum, link.actor_id))
                link.poll(0)
            relay = RelayThread(learner.endpoint, endpoint, peer_timeout_s=2)
            pump(links, lambda: all(link.connected and link.unacked_rows == 0 for link in links))
            assert learner.read(lambda service: service.counters.rows) == 2 * 2 * 16
            assert all(link.held_version == PolicyVersion(INCARNATION, 1) for link in links)
        finally:
            for link in links:
                link.close()
            relay.stop()


def test_a_learner_killed_and_restarted_behind_a_relay_loses_no_row_and_serves_its_weights(tmp_path, pendulum):
    from embodyrl.bench.chaos_parts import free_port

    endpoint, weights = f"tcp://127.0.0.1:{free_port()}", tree(np.random.default_rng(4))

    def learner(incarnation):
        return ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="r", incarnation=incarnation,
                             weights=weights, endpoint=endpoint, incarnations=(INCARNATION,))

    first = learner(INCARNATION)
    relay = RelayThread(endpoint, "tcp://127.0.0.1:*", peer_timeout_s=5)
    links = actors(relay.endpoint, pendulum, 2, peer_timeout_s=1)
    second = None
    try:
        for link in links:
            link.send_steps(0, batch(pendulum, link.actor_id))
        pump(links, lambda: all(link.unacked_rows == 0 for link in links))
        first.kill()  # no goodbye, nothing more committed: the actors spool, the relay waits
        for link in links:
            link.send_steps(0, batch(pendulum, link.actor_id))
            link.poll(0)
        second = learner(INCARNATION + 1)
        pump(links, lambda: all(link.unacked_rows == 0 for link in links), seconds=30)
        assert second.read(lambda service: service.data.replay.size) == 2 * 2 * 16
        # the new learner's first publication reaches the actors through the relay's new session
        pump(links, lambda: all(link.held_version.incarnation == INCARNATION + 1 for link in links), seconds=30)
    finally:
        for link in links:
            link.close()
        relay.stop()
        if second is not None:
            second.close()


def test_a_relay_admits_only_its_actors_keys_and_dials_a_keyed_learner_with_its_own(tmp_path, pendulum):
    learner_public, learner_secret = generate_keys(tmp_path / "learner", "learner")
    relay_public, relay_secret = generate_keys(tmp_path / "learner-authorized", "relay")
    (tmp_path / "learner-authorized" / "indices.json").write_text('{"relay": [0]}')  # it speaks for actor 0
    actor_public, actor_secret = generate_keys(tmp_path / "relay-authorized", "actor")
    _, stranger_secret = generate_keys(tmp_path / "stranger", "stranger")
    for secret in (relay_secret, actor_secret):  # only the public halves stay in the authorised directories
        secret.rename(tmp_path / secret.name)
    with ServedLearner(tmp_path / "run", envs.layout("pendulum"), run_id="r", incarnation=INCARNATION,
                       weights=tree(np.random.default_rng(2)),
                       keys=ServerKeys(learner_secret, tmp_path / "learner-authorized")) as learner:
        relay = RelayThread(learner.endpoint, "tcp://127.0.0.1:*",
                            keys=ServerKeys(tmp_path / relay_secret.name, tmp_path / "relay-authorized"),
                            learner_keys=ClientKeys(tmp_path / relay_secret.name, learner_public))
        (trusted,) = actors(relay.endpoint, pendulum, 1, keys=ClientKeys(tmp_path / actor_secret.name, relay_public))
        stranger = LearnerLink(relay.endpoint, actor_name="x", actor_id=0, devices=[pendulum], handshake_timeout_s=5,
                               keys=ClientKeys(stranger_secret, relay_public))
        try:
            trusted.send_steps(0, batch(pendulum, 0))
            pump([trusted], lambda: trusted.unacked_rows == 0)
            with pytest.raises(HandshakeFailed, match="not authori"):
                stranger.connect()
        finally:
            for link in (trusted, stranger):
                link.close()
            relay.stop()


def test_a_peer_without_a_session_gets_nothing_and_opens_nothing(tmp_path, pendulum):
    import zmq

    with ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="r", incarnation=INCARNATION,
                       weights=tree(np.random.default_rng(3))) as learner:
        relay = Relay(learner.endpoint, "tcp://127.0.0.1:*")
        attacker = zmq.Context.instance().socket(zmq.DEALER)
        attacker.setsockopt(zmq.LINGER, 0)
        attacker.connect(relay.endpoint)
        try:
            relay.connect()
            frames = encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [0, -1]}, batch(pendulum, 0).arrays())
            for _ in range(50):
                attacker.send_multipart(frames)
                attacker.send(b"garbage")
            deadline = time.monotonic() + 5
            while sum(relay.stats.rejected.values()) < 100 and time.monotonic() < deadline:
                relay.poll(5)
            assert relay.stats.rejected == {"unknown_peer": 50, "header_malformed": 50}
            assert not relay.peers and relay.stats.messages_up == 0 and not attacker.poll(100)
        finally:
            attacker.close()
            relay.close()


def test_the_relay_command_refuses_a_plain_address_off_this_machine_and_says_when_no_learner_answers():
    import subprocess
    import sys

    from cli_helpers import in_process

    refused = in_process("relay", "--connect", "tcp://127.0.0.1:9", "--bind", "tcp://0.0.0.0:*")
    assert refused.returncode == 2 and "--bind" in refused.stderr and "--insecure" in refused.stderr
    alone = subprocess.run([sys.executable, "-m", "embodyrl.cli", "relay", "--connect", "tcp://127.0.0.1:9",
                            "--handshake-timeout-s", "1"], capture_output=True, text=True, timeout=60)
    assert alone.returncode == 1 and "no WELCOME" in alone.stderr and not alone.stdout, alone.stderr
