import contextlib

import ml_dtypes
import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embodyrl.hal.dtypes import SUPPORTED_DTYPES, dtype_from_name
from embodyrl.hal.wire.codec import PROTOCOL_VERSION, Limits, MessageError, decode, encode


def _random_array(name: str, rng: np.random.Generator) -> np.ndarray:
    dtype = dtype_from_name(name)
    raw = rng.integers(0, 256, size=24, dtype=np.uint8)
    if name == "bool":
        return raw.reshape(2, 3, 4) % 2 == 0
    return raw.view(dtype).reshape(-1)  # arbitrary bit patterns, NaN payloads included


@pytest.mark.parametrize("name", SUPPORTED_DTYPES)
def test_every_dtype_round_trips_bit_exactly(name):
    array = _random_array(name, np.random.default_rng(0))
    out = decode(encode("T", {"n": 1}, {"x": array})).arrays["x"]
    assert out.dtype.newbyteorder("=") == array.dtype
    assert out.shape == array.shape
    assert out.tobytes() == array.tobytes()


def test_big_endian_input_is_sent_little_endian():
    array = np.arange(5, dtype=">f8")
    out = decode(encode("T", arrays={"x": array})).arrays["x"]
    np.testing.assert_array_equal(out, array)


def test_empty_and_scalar_arrays():
    msg = decode(encode("T", arrays={"e": np.zeros((0, 3), np.float32), "s": np.float64(2.5)}))
    assert msg.arrays["e"].shape == (0, 3)
    assert msg.arrays["s"].shape == () and msg.arrays["s"] == 2.5


def _header(**overrides):
    header = {"p": PROTOCOL_VERSION, "k": "T", "f": {}, "a": [["x", "float32", [2]]]}
    header.update(overrides)
    return msgpack.packb(header)


GOOD_FRAME = np.zeros(2, np.float32).tobytes()


@pytest.mark.parametrize(("frames", "reason"), [
    ([], "empty"),
    ([b"\xc1garbage"], "header_malformed"),
    ([msgpack.packb([1, 2, 3])], "header_malformed"),
    ([_header(p=99), GOOD_FRAME], "protocol"),
    ([_header(), GOOD_FRAME[:-1]], "frame_size"),  # truncated frame
    ([_header()], "frame_count"),  # truncated multipart
    ([_header(), GOOD_FRAME, GOOD_FRAME], "frame_count"),
    ([_header(a=[["x", "object", [2]]]), GOOD_FRAME], "dtype"),
    ([_header(a=[["x", "<f4", [2]]]), GOOD_FRAME], "dtype"),
    ([_header(a=[["x", "float32", [-2]]]), GOOD_FRAME], "array_malformed"),
    ([_header(a=[["x", "float32", [2**20, 2**20]]]), GOOD_FRAME], "frame_size"),
    ([_header(a=[["x", "float32", [1] * 9]]), GOOD_FRAME], "array_malformed"),
    ([_header(a=[["x", "float32"]]), GOOD_FRAME], "array_malformed"),
    ([_header(a=[["", "float32", [2]]]), GOOD_FRAME], "array_malformed"),
    ([_header(k=5), GOOD_FRAME], "header_malformed"),
    ([b"\x00" * 70_000], "header_size"),
])
def test_malformed_messages_are_refused_with_a_reason(frames, reason):
    with pytest.raises(MessageError) as info:
        decode(frames)
    assert info.value.reason == reason


def test_limits_apply_before_any_array_is_built():
    frames = encode("T", arrays={"x": np.zeros(1000, np.float32)})
    with pytest.raises(MessageError, match="frame_size"):
        decode(frames, Limits(max_frame_bytes=100))
    with pytest.raises(MessageError, match="too_many_arrays"):
        decode(encode("T", arrays={str(i): np.zeros(1) for i in range(5)}), Limits(max_arrays=4))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_random_bytes_never_crash_the_decoder(frames):
    with contextlib.suppress(MessageError):
        decode(frames)


def test_bfloat16_values_survive():
    array = np.array([1.5, -2.25, np.inf], ml_dtypes.bfloat16)
    out = decode(encode("T", arrays={"w": array})).arrays["w"]
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), array.astype(np.float32))
