"""Small arrays share one packed frame: round trips, order, the old layout, and hostile packed frames."""

import msgpack
import numpy as np
import pytest
import zmq

from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.codec import (
    PACKED,
    PROTOCOL_VERSION,
    MessageError,
    decode,
    decode_joined,
    encode,
    parse_header,
)


def _columns() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "observation/camera": rng.integers(0, 255, (4, 84, 84, 3), dtype=np.uint8),  # 84 KB: its own frame
        "observation/state": rng.normal(size=(4, 17)).astype(np.float32),
        "reward": rng.normal(size=4).astype(np.float32),
        "final": np.array([False, False, True, False]),  # 4 bytes: the next one starts padded
        "episode_id": np.arange(4, dtype=np.int64) << 40,
        "empty": np.zeros((0, 3), np.float32),
        "scalar": np.float64(2.5),
    }


def test_small_arrays_travel_in_one_frame_and_come_back_bit_exact_in_order():
    arrays = _columns()
    frames = encode(P.STEPS, {"seq": 1}, arrays)
    assert len(frames) == 3  # header, the camera, every small column together
    header = msgpack.unpackb(frames[0])
    assert [d[3] if len(d) == 4 else None for d in header["a"]] == [None] + [PACKED] * 6
    # over a real socket, as the server receives it (zmq frames, read-only views)
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://packed")
    b.connect("inproc://packed")
    try:
        a.send_multipart(frames, copy=False)
        assert b.poll(5000)
        out = decode(b.recv_multipart(copy=False)).arrays
    finally:
        a.close(0)
        b.close(0)
    assert list(out) == list(arrays)
    for name, value in arrays.items():
        value = np.asarray(value)
        assert out[name].dtype == value.dtype and out[name].shape == value.shape, name
        assert out[name].tobytes() == value.tobytes(), name


def test_a_lone_small_array_keeps_its_own_frame_and_the_old_layout_still_decodes():
    frames = encode("T", {}, {"x": np.arange(3, dtype=np.int32)})
    assert len(msgpack.unpackb(frames[0])["a"][0]) == 3  # no codec: nothing to pack it with
    # the layout older senders use (and spools on disk hold): one frame per array
    arrays = {"a": np.arange(3, dtype=np.float32), "b": np.ones(2, np.int64)}
    header = msgpack.packb({"p": PROTOCOL_VERSION, "k": "T", "f": {},
                            "a": [["a", "float32", [3]], ["b", "int64", [2]]]})
    out = decode([header, arrays["a"].tobytes(), arrays["b"].tobytes()]).arrays
    assert out["a"].tolist() == [0, 1, 2] and out["b"].tolist() == [1, 1]


def _packed_message(extra: bytes = b"", cut: int = 0, frames_after: list | None = None):
    frames = encode("T", {}, {"a": np.arange(3, dtype=np.float32), "b": np.arange(5, dtype=np.int64)})
    packed = bytes(frames[-1])
    packed = packed[:len(packed) - cut] + extra
    return [frames[0], packed, *(frames_after or [])]


@pytest.mark.parametrize("frames, reason", [
    (_packed_message(cut=1), "frame_size"),  # the last array runs past the frame
    (_packed_message(extra=b"\0" * 8), "frame_size"),  # trailing bytes no array claims
    (_packed_message(frames_after=[b"x"]), "frame_count"),  # a frame the header does not describe
    (_packed_message()[:1], "frame_count"),  # the packed frame missing
])
def test_malformed_packed_frames_are_refused_with_a_reason(frames, reason):
    with pytest.raises(MessageError) as info:
        decode(frames)
    assert info.value.reason == reason


def test_a_packed_array_larger_than_the_frame_limit_is_refused_before_any_allocation():
    from embodyrl.hal.wire.codec import Limits

    header = msgpack.packb({"p": PROTOCOL_VERSION, "k": "T", "f": {},
                            "a": [["a", "float32", [1 << 28], PACKED], ["b", "int8", [1], PACKED]]})
    with pytest.raises(MessageError) as info:
        decode([header, b"\0" * 16], Limits(max_frame_bytes=1 << 20))
    assert info.value.reason == "frame_size"


def test_packed_messages_join_row_wise_as_decoding_each_would_and_a_short_frame_is_left_to_each():
    rng = np.random.default_rng(1)
    messages = [encode(P.STEPS, {"seq": k}, {
        "observation/state": rng.normal(size=(5, 3, 2)).astype(np.float32),
        "final": rng.random(5) < 0.5,  # 5 bytes: the next one starts padded
        "episode_id": rng.integers(0, 1 << 40, 5),
        "reward": rng.normal(size=5)}) for k in range(3)]
    header = parse_header(messages[0])
    joined = decode_joined(header, messages)
    for name, column in joined.items():
        each = np.concatenate([decode(m).arrays[name] for m in messages])
        assert column.dtype == each.dtype and column.shape == each.shape
        np.testing.assert_array_equal(column, each, err_msg=name)
    short = [*messages[:2], [messages[2][0], bytes(messages[2][1])[:-8]]]
    assert decode_joined(header, short) is None  # decoding each names the message at fault
    camera = encode(P.STEPS, {"seq": 1}, _columns())
    assert decode_joined(parse_header(camera), [camera, camera]) is None  # an array in its own frame
