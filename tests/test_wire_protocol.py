"""Wire protocol 2 (packed frames) beside protocol 1: both decode, and a handshake across versions
fails at once with a reason naming the side to upgrade, never as batches rejected in silence.
Real ZeroMQ sockets on loopback; the protocol-1 peer is emulated by what its code sent and read."""

import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.client import LearnerLink, LinkError
from embodyrl.hal.wire.codec import PACKED, PROTOCOL_VERSION, MessageError, decode, encode
from embodyrl.transport import LearnerServer

DEVICE = P.DeviceInfo(0, "d", DictSpec.of(ArraySpec("x", (2,), np.float32)), ArraySpec("action", (1,), np.float32, -1, 1))
ARRAYS = {"a": np.arange(3, dtype=np.float32), "b": np.ones(2, np.int64), "c": np.array([True, False])}


def _v1_decode(frames: list) -> dict:
    """What a protocol-1 receiver accepted: header p == 1 and exactly one frame per array."""
    header = msgpack.unpackb(bytes(frames[0]))
    assert header["p"] == 1, f"a protocol-1 peer refuses protocol {header['p']}"
    assert len(header["a"]) == len(frames) - 1 and all(len(d) == 3 for d in header["a"])
    return header


def test_both_versions_decode_and_protocol_1_never_packs():
    assert PROTOCOL_VERSION == 2
    new = encode("T", {"n": 1}, ARRAYS)
    assert len(new) == 2 and msgpack.unpackb(new[0])["a"][0][3] == PACKED
    old = encode("T", {"n": 1}, ARRAYS, protocol=1)
    _v1_decode(old)
    for frames, protocol in ((new, 2), (old, 1)):
        msg = decode(frames)
        assert msg.protocol == protocol and msg.fields == {"n": 1}
        for name, value in ARRAYS.items():
            np.testing.assert_array_equal(msg.arrays[name], value)


@pytest.mark.parametrize("p, descriptors, frames, reason", [
    (1, [["a", "float32", [1], PACKED], ["b", "int8", [1], PACKED]], [b"\0" * 9], "protocol"),  # packing is v2
    (3, [], [], "protocol"),
    (True, [], [], "protocol"),
    ("2", [], [], "protocol"),
])
def test_unknown_versions_and_packing_in_protocol_1_are_refused(p, descriptors, frames, reason):
    with pytest.raises(MessageError) as info:
        decode([msgpack.packb({"p": p, "k": "T", "f": {}, "a": descriptors}), *frames])
    assert info.value.reason == reason


def _socket(kind: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def test_the_learner_refuses_a_protocol_1_actor_in_words_it_can_read():
    server = LearnerServer(run_id="r", incarnation=1)
    old_actor = _socket(zmq.DEALER)
    old_actor.connect(server.endpoint)
    try:  # a protocol-1 actor's HELLO: header p=1, no "protocol" field
        old_actor.send_multipart(encode(P.HELLO, {"actor": "old", "actor_id": 3, "devices": [DEVICE.to_msg()],
                                                  "last_acked_seq": 0, "held": [0, -1]}, protocol=1))
        deadline = time.monotonic() + 10
        while not old_actor.poll(20) and time.monotonic() < deadline:
            server.poll(20)
        reply = old_actor.recv_multipart()
        header = _v1_decode(reply)
        assert header["k"] == P.REFUSED
        reason = header["f"]["reason"]
        assert "actor speaks 1" in reason and "upgrade the actor" in reason
        assert server.sessions == {} and server.stats.rejected == {"protocol": 1}
    finally:
        old_actor.close(0)
        server.close()


def test_an_actor_leaves_a_protocol_1_learner_with_a_reason():
    old_learner = _socket(zmq.ROUTER)
    port = old_learner.bind_to_random_port("tcp://127.0.0.1")
    link = LearnerLink(f"tcp://127.0.0.1:{port}", actor_name="new", actor_id=1, devices=[DEVICE],
                       handshake_timeout_s=10.0)
    errors = []

    def connect():
        try:
            link.connect()
        except LinkError as err:
            errors.append(str(err))

    thread = threading.Thread(target=connect)
    thread.start()
    try:
        assert old_learner.poll(10000)
        identity, *frames = old_learner.recv_multipart()
        header = _v1_decode(frames)  # the HELLO is readable by a protocol-1 learner
        assert header["k"] == P.HELLO and header["f"]["protocol"] == 2
        old_learner.send_multipart([identity, *encode(P.WELCOME, {
            "protocol": 1, "run_id": "old", "incarnation": 1, "credits": 0, "committed_seq": 0}, protocol=1)])
        thread.join(10)
        assert not thread.is_alive()
        assert errors and "learner speaks 1" in errors[0] and "upgrade the learner" in errors[0]
        assert not link.connected
    finally:
        thread.join(10)
        link.close(send_bye=False)
        old_learner.close(0)


def test_actor_and_learner_of_this_version_still_shake_hands():
    server = LearnerServer(run_id="r", incarnation=1)
    link = LearnerLink(server.endpoint, actor_name="a", actor_id=1, devices=[DEVICE], handshake_timeout_s=10.0)
    thread = threading.Thread(target=link.connect)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while thread.is_alive() and time.monotonic() < deadline:
            server.poll(20)
        thread.join(5)
        assert link.connected and link.run_id == "r" and list(server.sessions.values())[0].actor_id == 1
    finally:
        link.close()
        server.close()
