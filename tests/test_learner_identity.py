"""The learner server against a peer that lies: about its size, its index, its versions, its seqs.

Real ZeroMQ sockets and real CurveZMQ keys; the attacker is a raw DEALER that
writes whatever it likes, the honest actor a real LearnerLink.
"""

import json
import shutil
import time

import msgpack
import numpy as np
import pytest
import zmq

from embodyrl import envs
from embodyrl.hal.steps import NO_POLICY, PolicyVersion, StepRecorder
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.client import LearnerLink, LinkError
from embodyrl.hal.wire.codec import PROTOCOL_VERSION, encode
from embodyrl.hal.wire.security import ClientKeys, ServerKeys, generate_keys, secure_client
from embodyrl.learner.testing import ServedLearner

zstandard = pytest.importorskip("zstandard")
GIB = 1 << 30


def _device_info():
    device, _ = envs.make("pendulum")
    return device, P.DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)


def _steps(actor_id: int, n: int = 4, version=NO_POLICY):
    device, _ = envs.make("pendulum")
    rec = StepRecorder(device.observation_spec, device.action_spec, actor_id=actor_id, device_id=0)
    with device:
        obs = device.reset(seed=0)
        for _ in range(n):
            rec.add(obs, np.zeros(1, np.float32), np.zeros(1, np.float32), 0.0, False, False, version)
    return rec.flush()


def _reset_peak_rss() -> float:
    """Reset this process's peak RSS (VmHWM) to its current RSS; return that, in MB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mb("VmHWM")


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def _served(tmp_path, **server_options) -> ServedLearner:
    """The real learner service on loopback (it acks, commits and grants credit as in a run)."""
    return ServedLearner(tmp_path / "learner", envs.layout("pendulum"), **server_options)


def _raw(endpoint, keys: ClientKeys | None = None):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        secure_client(sock, keys)
    sock.connect(endpoint)
    return sock


def _hello(actor_id, info, instance=None):
    fields = {"actor": "x", "actor_id": actor_id, "devices": [info.to_msg()], "last_acked_seq": 0,
              "held": [0, -1], "protocol": PROTOCOL_VERSION}
    if instance is not None:
        fields["instance"] = instance
    return encode(P.HELLO, fields, protocol=P.HELLO_PROTOCOL)


def _bomb(seq=1):
    """24 KiB of zstd that inflates to 1 GiB of zeros (streamed: never held whole here)."""
    compressor = zstandard.ZstdCompressor(level=19)
    chunk, out = bytes(1 << 24), compressor.compressobj()
    data = b"".join(out.compress(chunk) for _ in range(GIB // len(chunk))) + out.flush()
    header = {"p": PROTOCOL_VERSION, "k": P.STEPS, "f": {"seq": seq, "device_id": 0, "held": [0, -1]},
              "a": [["reward", "float32", [GIB // 4], "zstd"]]}
    return [msgpack.packb(header), data]


@pytest.fixture
def keyring(tmp_path):
    server_pub, server_secret = generate_keys(tmp_path / "learner", "learner")
    authorized = tmp_path / "authorized"
    clients = {}
    authorized.mkdir()
    for name in ("honest", "attacker"):
        public, secret = generate_keys(tmp_path / name, name)
        shutil.copy(public, authorized / public.name)
        clients[name] = ClientKeys(secret, server_pub)
    return ServerKeys(server_secret, authorized), clients


def test_a_decompression_bomb_costs_a_header_parse_without_a_session_and_the_limits_with_one(tmp_path):
    served = _served(tmp_path, run_id="r", incarnation=1)
    _, info = _device_info()
    attacker = _raw(served.server.endpoint)
    try:
        bomb = _bomb()
        assert len(bomb[1]) < 64 * 1024
        before = _reset_peak_rss()
        attacker.send_multipart(bomb)  # no session yet
        assert served.wait(lambda s: s.server.stats.rejected.get("unknown_peer"))
        attacker.send_multipart(_hello(3, info))
        assert served.wait(lambda s: s.server.sessions)
        attacker.send_multipart(bomb)  # a session whose specs make a pendulum batch a few hundred KB
        assert served.wait(lambda s: s.server.stats.messages_in >= 3 and sum(s.server.stats.rejected.values()) >= 2)
        growth = _status_mb("VmHWM") - before  # the peak: a freed GiB leaves RSS, not the peak
    finally:
        attacker.close(0)
        served.close()
    assert growth < 64, f"RSS grew {growth:.0f} MB for a 1 GiB bomb"
    rejected = served.server.stats.rejected
    assert rejected["unknown_peer"] == 1
    assert rejected.get("message_size", 0) + rejected.get("frame_size", 0) == 1


def test_session_limits_come_from_the_declared_specs(tmp_path):
    served = _served(tmp_path, run_id="r", incarnation=1, max_batch_rows=64)
    _, info = _device_info()
    link = LearnerLink(served.server.endpoint, actor_name="a", actor_id=0, devices=[info], handshake_timeout_s=10)
    try:
        link.connect()
        limits = served.read(lambda s: next(iter(s.server.sessions.values())).limits)
        wire = sum(a.nbytes for a in _steps(0, n=64).arrays().values())
        assert wire <= limits.max_message_bytes < 2 * wire + 8192  # the largest valid batch, with a margin
    finally:
        link.close()
        served.close()


def _link(served, actor_id, keys=None, handshake_timeout_s=10, **kwargs):
    _, info = _device_info()
    return LearnerLink(served.server.endpoint, actor_name=f"actor-{actor_id}", actor_id=actor_id, devices=[info],
                       keys=keys, handshake_timeout_s=handshake_timeout_s, **kwargs)


def test_a_hello_claiming_another_keys_index_is_refused_and_the_owner_reconnects(keyring, tmp_path):
    server_keys, clients = keyring
    served = _served(tmp_path, run_id="r", incarnation=1, keys=server_keys,
                                  bindings_path=tmp_path / "bindings.json")
    _, info = _device_info()
    honest = _link(served, 0, clients["honest"])
    attacker = _raw(served.server.endpoint, clients["attacker"])
    try:
        honest.connect()
        honest.send_steps(0, _steps(0))
        assert honest.flush(10) and honest.acked_seq == 1
        # the attacker claims index 0 and, if it could, would push committed_seq far ahead
        attacker.send_multipart(_hello(0, info, instance="evil"))
        assert attacker.poll(10_000)
        reply = attacker.recv_multipart()
        assert b"REFUSED" in reply[0] and b"belongs to another key" in reply[0]
        attacker.send_multipart(encode(P.STEPS, {"seq": 10**6, "device_id": 0, "held": [0, -1]},
                                       _steps(0).arrays()))
        assert served.wait(lambda s: s.server.stats.rejected.get("unknown_peer"))
        assert served.rejected("index_taken") == 1
        assert served.read(lambda s: [x.actor_id for x in s.server.sessions.values()]) == [0]
        # the honest actor's next batch is stored and acknowledged as if nothing happened
        honest.send_steps(0, _steps(0))
        assert honest.flush(10) and honest.acked_seq == 2
        # the actor restarts (a new link, a fresh socket, the same key): its index and seq carry on
        honest.close(send_bye=False)
        honest = _link(served, 0, clients["honest"])
        honest.connect()
        assert honest.acked_seq == 2 and served.rejected("index_taken") == 1
        assert json.loads((tmp_path / "bindings.json").read_text()) == {"honest": 0}
    finally:
        honest.close()
        attacker.close(0)
        served.close()
    assert [b.seq for b in served.taken] == [1, 2]
    # a restarted learner keeps the binding: the attacker cannot take index 0 in the window before
    # the honest actor reconnects
    served = _served(tmp_path, run_id="r", incarnation=2, keys=server_keys, bindings_path=tmp_path / "bindings.json")
    attacker = _raw(served.server.endpoint, clients["attacker"])
    try:
        attacker.send_multipart(_hello(0, info, instance="evil"))
        assert served.wait(lambda s: s.server.stats.rejected.get("index_taken"))
        assert not served.read(lambda s: s.server.sessions)
    finally:
        attacker.close(0)
        served.close()


def test_indices_json_names_the_indices_a_key_may_use(keyring, tmp_path):
    server_keys, clients = keyring
    (server_keys.authorized_dir / "indices.json").write_text(json.dumps({"honest": [0, 1], "attacker": [5]}))
    served = _served(tmp_path, run_id="r", incarnation=1, keys=server_keys)
    _, info = _device_info()
    socks = {name: _raw(served.server.endpoint, clients[name]) for name in ("honest", "attacker")}
    try:
        socks["honest"].send_multipart(_hello(1, info))
        socks["attacker"].send_multipart(_hello(0, info))
        assert served.wait(lambda s: s.server.sessions and s.server.stats.rejected.get("index_taken"))
        assert served.read(lambda s: [x.actor_id for x in s.server.sessions.values()]) == [1]
    finally:
        for sock in socks.values():
            sock.close(0)
        served.close()


def test_without_keys_a_second_actor_with_a_live_index_is_refused_by_name(tmp_path):
    served = _served(tmp_path, run_id="r", incarnation=1, duplicate_window_s=5.0)
    first = _link(served, 7)
    try:
        first.connect()
        started = time.monotonic()
        with pytest.raises(LinkError, match="actor index 7 is in use"):
            _link(served, 7, handshake_timeout_s=2).connect()  # the first is heard within the window
        assert time.monotonic() - started >= 2  # it tried again until its deadline, then named the cause
        assert served.rejected("index_in_use") >= 2
    finally:
        first.close(send_bye=False)
        served.close()


def test_without_keys_a_refused_restart_gets_its_index_once_the_old_session_falls_silent(tmp_path):
    served = _served(tmp_path, run_id="r", incarnation=1, duplicate_window_s=1.0)
    killed = _link(served, 3)  # a killed actor: its session stays, silent, at the learner
    killed.connect()
    restarted = _link(served, 3, handshake_timeout_s=10)
    try:
        started = time.monotonic()
        restarted.connect()  # refused while the window lasts, then let in
        assert time.monotonic() - started < 5
        assert served.rejected("index_in_use") >= 1
    finally:
        restarted.close()
        killed.close(send_bye=False)
        served.close()


def test_without_keys_a_killed_actors_restart_gets_its_index_after_three_quiet_heartbeats(tmp_path):
    from embodyrl.hal.wire.client import HEARTBEAT_S
    from embodyrl.transport.server import DUPLICATE_WINDOW_S

    assert DUPLICATE_WINDOW_S == 3 * HEARTBEAT_S
    served = _served(tmp_path, run_id="r", incarnation=1)  # the default window
    killed = _link(served, 3)  # a killed actor: its session stays, silent, at the learner
    killed.connect()
    restarted = _link(served, 3, handshake_timeout_s=20)  # retries HELLO until its deadline
    try:
        started = time.monotonic()
        restarted.connect()
        waited = time.monotonic() - started
        assert served.read(lambda s: [x.instance for x in s.server.sessions.values()]) == [restarted.instance]
    finally:
        restarted.close()
        killed.close(send_bye=False)
        served.close()
    assert DUPLICATE_WINDOW_S - 0.5 <= waited < DUPLICATE_WINDOW_S + 6
    assert served.server.stats.rejected["index_in_use"] >= 2


def test_without_keys_the_same_link_instance_reconnects_at_once_and_another_waits_out_the_window(tmp_path):
    served = _served(tmp_path, run_id="r", incarnation=1, duplicate_window_s=5.0)
    _, info = _device_info()
    socks = [_raw(served.server.endpoint) for _ in range(3)]
    try:
        socks[0].send_multipart(_hello(4, info, instance="same"))
        assert served.wait(lambda s: s.server.sessions)
        socks[1].send_multipart(_hello(4, info, instance="same"))  # its reconnect: a new connection
        socks[2].send_multipart(_hello(4, info, instance="other"))  # a second actor with index 4
        assert served.wait(lambda s: s.server.stats.rejected.get("index_in_use"))
        assert b"WELCOME" in socks[1].recv_multipart()[0]
        assert b"in use" in socks[2].recv_multipart()[0]
        assert served.read(lambda s: [x.instance for x in s.server.sessions.values()]) == ["same"]
    finally:
        for sock in socks:
            sock.close(0)
        served.close()


def test_forged_policy_versions_and_oversized_shapes_are_refused_by_reason(tmp_path):
    served = _served(tmp_path, run_id="r", incarnation=11)
    _, info = _device_info()
    attacker = _raw(served.server.endpoint)
    try:
        attacker.send_multipart(_hello(2, info))
        assert served.wait(lambda s: s.server.sessions)
        served.read(lambda s: s.server.publish(PolicyVersion(11, 3), {"w": np.zeros(3, np.float32)}))
        attacker.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [11, 99]}, _steps(2).arrays()))
        attacker.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [0, -1]},
                                       _steps(2, version=PolicyVersion(11, 50)).arrays()))
        huge = {"p": PROTOCOL_VERSION, "k": P.STEPS, "f": {"seq": 1, "device_id": 0, "held": [0, -1]},
                "a": [["reward", "float32", [1 << 28]]]}
        attacker.send_multipart([msgpack.packb(huge), b"\0" * 16])
        attacker.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [11, 3]}, _steps(2).arrays()))
        assert served.wait(lambda s: s.server.stats.messages_in >= 5)
    finally:
        attacker.close(0)
        served.close()
    rejected = served.server.stats.rejected
    assert rejected["policy_version"] == 2
    assert rejected.get("message_size", 0) + rejected.get("frame_size", 0) == 1
    assert [b.seq for b in served.taken] == [1]  # the honest-looking batch after them still goes through
