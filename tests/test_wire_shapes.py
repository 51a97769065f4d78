"""Hostile shapes: every decode failure is a MessageError with a reason, never numpy's own error,
and a live server counts it and keeps serving (real ZeroMQ sockets on loopback)."""

import math
import time

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.codec import PACKED, PROTOCOL_VERSION, MessageError, decode, encode
from embodyrl.transport import LearnerServer

HUGE = [2**31, 2**32 + 1, 2**62, 2**63, 2**64 - 1]


def _message(descriptors: list, frames: list) -> list:
    return [msgpack.packb({"p": PROTOCOL_VERSION, "k": "T", "f": {}, "a": descriptors}), *frames]


@pytest.mark.parametrize("descriptors, frames", [
    ([["a", "float32", [0, 2**63]]], [b""]),
    ([["a", "float32", [0, 2**62, 2**62]]], [b""]),
    ([["a", "uint8", [2**40, 0, 2**40]]], [b""]),
    ([["a", "float32", [0, 2**63], PACKED], ["b", "int8", [1], PACKED]], [b"\0"]),
    ([["a", "int8", [1], PACKED], ["b", "float64", [0, 2**62, 4], PACKED]], [b"\0"]),
])
def test_an_empty_array_with_huge_dimensions_is_refused_with_a_reason(descriptors, frames):
    with pytest.raises(MessageError) as info:
        decode(_message(descriptors, frames))
    assert info.value.reason == "array_malformed" and "empty shape" in str(info.value)


def test_empty_arrays_of_sane_shape_still_decode():
    out = decode(encode("T", {}, {"a": np.zeros((0, 84, 84, 3), np.uint8), "b": np.zeros((5, 0), np.float64)}))
    assert out.arrays["a"].shape == (0, 84, 84, 3) and out.arrays["b"].shape == (5, 0)


dim = st.one_of(st.just(0), st.integers(0, 8), st.integers(0, 2**64 - 1), st.sampled_from(HUGE))
descriptor = st.tuples(st.sampled_from(["float32", "uint8", "int64", "bool", "float16", "bfloat16"]),
                       st.lists(dim, max_size=9), st.sampled_from([None, PACKED, "zstd", "bogus"]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(descriptor, max_size=4), st.booleans(), st.binary(max_size=40))
def test_any_shape_either_decodes_exactly_or_is_a_message_error(items, right_sizes, junk):
    from embodyrl.hal.dtypes import dtype_from_name

    descriptors, own, packed = [], [], bytearray()
    for i, (dtype, shape, codec) in enumerate(items):
        descriptors.append([f"a{i}", dtype, shape] + ([codec] if codec else []))
        nbytes = math.prod(shape) * dtype_from_name(dtype).itemsize
        body = bytes(min(nbytes, 64)) if right_sizes else junk  # honest sizes for small arrays
        if codec == PACKED:
            packed += bytes(-len(packed) % 8) + body
        else:
            own.append(body)
    frames = own + ([bytes(packed)] if any(c == PACKED for _, _, c in items) else [])
    try:
        out = decode(_message(descriptors, frames))
    except MessageError as err:
        assert err.reason and str(err)
        return
    for (dtype, shape, _), name in zip(items, out.arrays, strict=True):
        assert out.arrays[name].shape == tuple(shape) and out.arrays[name].dtype == dtype_from_name(dtype)


def _dealer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def test_a_live_server_counts_a_hostile_shape_and_keeps_serving():
    server = LearnerServer(run_id="r", incarnation=1)
    attacker, honest = _dealer(server.endpoint), _dealer(server.endpoint)
    try:
        for descriptors, frames in ([[["a", "float32", [0, 2**63]]], [b""]],
                                    [[["a", "float32", [0, 2**62, 2**62], PACKED], ["b", "int8", [1], PACKED]], [b"\0"]]):
            attacker.send_multipart(_message(descriptors, frames))  # before any HELLO: unauthenticated
        deadline = time.monotonic() + 10
        while server.stats.messages_in < 2 and time.monotonic() < deadline:
            assert server.poll(20) == []
        assert server.stats.rejected.get("array_malformed") == 2
        honest.send_multipart(encode(P.HELLO, {"actor": "ok", "actor_id": 1, "devices": [], "held": [0, -1],
                                               "protocol": PROTOCOL_VERSION}))
        while not server.sessions and time.monotonic() < deadline:
            server.poll(20)
        assert honest.poll(5000), "no WELCOME: the server stopped serving"
        assert decode(honest.recv_multipart()).kind == P.WELCOME
    finally:
        attacker.close(0)
        honest.close(0)
        server.close()


def test_decoded_arrays_are_read_only_over_tcp_packed_or_not():
    a, b = zmq.Context.instance().socket(zmq.PAIR), zmq.Context.instance().socket(zmq.PAIR)
    a.setsockopt(zmq.LINGER, 0)
    b.setsockopt(zmq.LINGER, 0)
    port = a.bind_to_random_port("tcp://127.0.0.1")
    b.connect(f"tcp://127.0.0.1:{port}")
    arrays = {"big": np.arange(100_000, dtype=np.float32), "s1": np.ones(3), "s2": np.arange(5, dtype=np.int64)}
    try:
        a.send_multipart(encode("T", {}, arrays), copy=False)
        assert b.poll(5000)
        out = decode(b.recv_multipart(copy=False)).arrays
    finally:
        a.close(0)
        b.close(0)
    for name, value in arrays.items():
        np.testing.assert_array_equal(out[name], value)  # aligned or not, the values are exact
        with pytest.raises(ValueError, match="read-only"):
            out[name][0] = 7  # a frame the replay may still be writing from cannot change
