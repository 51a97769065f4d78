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
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.codec import PROTOCOL_VERSION, encode
from embodyrl.hal.wire.security import ClientKeys, ServerKeys, generate_keys, secure_client
from embodyrl.transport import LearnerServer

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


def _serve(server, until, timeout_s=10.0):
    """Poll until ``until()``; return the batches received (acked, with credit)."""
    got, deadline = [], time.monotonic() + timeout_s
    while not until() and time.monotonic() < deadline:
        for b in server.poll(10):
            got.append(b)
            server.ack(b.session, b.seq, credits=len(b.steps))
        for s in server.sessions.values():
            if not getattr(s, "granted", False):
                server.grant(s, 1024)
                s.granted = True
    return got


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


def test_a_decompression_bomb_costs_a_header_parse_without_a_session_and_the_limits_with_one():
    server = LearnerServer(run_id="r", incarnation=1)
    _, info = _device_info()
    attacker = _raw(server.endpoint)
    try:
        bomb = _bomb()
        assert len(bomb[1]) < 64 * 1024
        before = _reset_peak_rss()
        attacker.send_multipart(bomb)  # no session yet
        _serve(server, lambda: server.stats.rejected.get("unknown_peer"))
        attacker.send_multipart(_hello(3, info))
        _serve(server, lambda: server.sessions)
        attacker.send_multipart(bomb)  # a session whose specs make a pendulum batch a few hundred KB
        _serve(server, lambda: server.stats.rejected.get("message_size") or server.stats.rejected.get("frame_size"))
        growth = _status_mb("VmHWM") - before  # the peak: a freed GiB leaves RSS, not the peak
    finally:
        attacker.close(0)
        server.close()
    assert growth < 64, f"RSS grew {growth:.0f} MB for a 1 GiB bomb"
    assert server.stats.rejected["unknown_peer"] == 1
    assert server.stats.rejected.get("message_size", 0) + server.stats.rejected.get("frame_size", 0) == 1


def test_session_limits_come_from_the_declared_specs():
    server = LearnerServer(run_id="r", incarnation=1, max_batch_rows=64)
    _, info = _device_info()
    link = LearnerLink(server.endpoint, actor_name="a", actor_id=0, devices=[info], handshake_timeout_s=5)
    try:
        link._dial()
        _serve(server, lambda: server.sessions)
        limits = next(iter(server.sessions.values())).limits
        steps = _steps(0, n=64)
        wire = sum(a.nbytes for a in steps.arrays().values())
        assert wire <= limits.max_message_bytes < 2 * wire + 8192  # the largest valid batch, with a margin
    finally:
        link.close(send_bye=False)
        server.close()


def test_a_hello_claiming_another_keys_index_is_refused_and_the_owner_reconnects(keyring, tmp_path):
    server_keys, clients = keyring
    server = LearnerServer(run_id="r", incarnation=1, keys=server_keys,
                           bindings_path=tmp_path / "bindings.json")
    _, info = _device_info()
    honest = LearnerLink(server.endpoint, actor_name="h", actor_id=0, devices=[info], keys=clients["honest"],
                         handshake_timeout_s=5)
    attacker = _raw(server.endpoint, clients["attacker"])
    try:
        honest._dial()
        _serve(server, lambda: honest.connected or honest._receive(0))
        honest.send_steps(0, _steps(0))
        _serve(server, lambda: (honest.poll(0) or honest.acked_seq >= 1))
        assert honest.acked_seq == 1
        # the attacker claims index 0 and, if it could, would push committed_seq far ahead
        attacker.send_multipart(_hello(0, info, instance="evil"))
        attacker.send_multipart(encode(P.STEPS, {"seq": 10**6, "device_id": 0, "held": [0, -1]},
                                       _steps(0).arrays()))
        _serve(server, lambda: server.stats.rejected.get("index_taken") and server.stats.rejected.get("unknown_peer"))
        assert server.stats.rejected["index_taken"] == 1
        reply = attacker.recv_multipart()
        assert b"REFUSED" in reply[0] and b"belongs to another key" in reply[0]
        assert [s.key is not None and s.actor_id for s in server.sessions.values()] == [0]
        # the honest actor still gets its batches stored and acknowledged
        honest.send_steps(0, _steps(0))
        more = _serve(server, lambda: (honest.poll(0) or honest.acked_seq >= 2))
        assert [b.seq for b in more] == [2] and honest.acked_seq == 2
        # the owner reconnects on a fresh socket (a new ZeroMQ identity): its session and seq carry on
        old = next(iter(server.sessions))
        honest._disconnect()
        honest._dial()
        _serve(server, lambda: (honest._receive(0) or honest.connected))
        assert honest.connected and old not in server.sessions
        assert next(iter(server.sessions.values())).committed_seq == 2
        assert json.loads((tmp_path / "bindings.json").read_text()) == {"honest": 0}
    finally:
        honest.close(send_bye=False)
        attacker.close(0)
        server.close()
    # a restarted learner keeps the binding: the attacker cannot take index 0 in the window before
    # the honest actor reconnects
    server = LearnerServer(run_id="r", incarnation=2, keys=server_keys, bindings_path=tmp_path / "bindings.json")
    attacker = _raw(server.endpoint, clients["attacker"])
    try:
        attacker.send_multipart(_hello(0, info, instance="evil"))
        _serve(server, lambda: server.stats.rejected.get("index_taken"))
        assert server.stats.rejected["index_taken"] == 1 and not server.sessions
    finally:
        attacker.close(0)
        server.close()


def test_indices_json_names_the_indices_a_key_may_use(keyring):
    server_keys, clients = keyring
    (server_keys.authorized_dir / "indices.json").write_text(json.dumps({"honest": [0, 1], "attacker": [5]}))
    server = LearnerServer(run_id="r", incarnation=1, keys=server_keys)
    _, info = _device_info()
    socks = {name: _raw(server.endpoint, clients[name]) for name in ("honest", "attacker")}
    try:
        socks["honest"].send_multipart(_hello(1, info))
        socks["attacker"].send_multipart(_hello(0, info))
        _serve(server, lambda: server.sessions and server.stats.rejected.get("index_taken"))
        assert [s.actor_id for s in server.sessions.values()] == [1]
        assert server.stats.rejected["index_taken"] == 1
    finally:
        for s in socks.values():
            s.close(0)
        server.close()


def test_without_keys_a_second_actor_with_a_live_index_is_refused_by_name():
    server = LearnerServer(run_id="r", incarnation=1)
    _, info = _device_info()
    first = LearnerLink(server.endpoint, actor_name="a", actor_id=7, devices=[info], handshake_timeout_s=5)
    second = LearnerLink(server.endpoint, actor_name="b", actor_id=7, devices=[info], handshake_timeout_s=5)
    try:
        first._dial()
        _serve(server, lambda: (first._receive(0) or first.connected))
        second._dial()
        _serve(server, lambda: (second._receive(0) or second.bye_reason))
        assert "actor index 7 is in use" in second.bye_reason
        assert server.stats.rejected["index_in_use"] == 1
        # the first actor's own reconnect (same link, a fresh socket) is never refused
        first._disconnect()
        first._dial()
        _serve(server, lambda: (first._receive(0) or first.connected))
        assert first.connected and first.bye_reason is None
    finally:
        first.close(send_bye=False)
        second.close(send_bye=False)
        server.close()


def test_forged_policy_versions_and_oversized_shapes_are_refused_by_reason():
    server = LearnerServer(run_id="r", incarnation=11)
    _, info = _device_info()
    attacker = _raw(server.endpoint)
    try:
        attacker.send_multipart(_hello(2, info))
        _serve(server, lambda: server.sessions)
        server.publish(PolicyVersion(11, 3), {"w": np.zeros(3, np.float32)})
        attacker.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [11, 99]}, _steps(2).arrays()))
        attacker.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [0, -1]},
                                       _steps(2, version=PolicyVersion(11, 50)).arrays()))
        huge = {"p": PROTOCOL_VERSION, "k": P.STEPS, "f": {"seq": 1, "device_id": 0, "held": [0, -1]},
                "a": [["reward", "float32", [1 << 28]]]}
        attacker.send_multipart([msgpack.packb(huge), b"\0" * 16])
        attacker.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [11, 3]}, _steps(2).arrays()))
        got = _serve(server, lambda: sum(server.stats.rejected.values()) >= 3 and server.stats.messages_in >= 5)
    finally:
        attacker.close(0)
        server.close()
    assert server.stats.rejected["policy_version"] == 2
    assert server.stats.rejected.get("message_size", 0) + server.stats.rejected.get("frame_size", 0) == 1
    assert [b.seq for b in got] == [1]  # the honest-looking batch after them still goes through
