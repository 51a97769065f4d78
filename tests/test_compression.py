import numpy as np
import pytest

from embodyrl.hal.wire import codec
from embodyrl.hal.wire.codec import MessageError, decode, encode
from embodyrl.hal.wire.compression import AdaptiveCompression, compress


def image_batch():
    frames = np.zeros((16, 84, 84, 3), np.uint8)
    frames[:, 20:40, 30:50] = 200  # a static scene: compresses well
    return {"observation/camera": frames, "reward": np.arange(16, dtype=np.float32)}


@pytest.mark.parametrize("name", ["zstd", "lz4"])
def test_compressed_frames_round_trip_bit_exactly(name):
    arrays = image_batch()
    frames = encode("STEPS", {}, arrays, compression=name)
    assert sum(len(f) for f in frames) < 0.2 * arrays["observation/camera"].nbytes
    out = decode(frames).arrays
    for k, v in arrays.items():
        assert out[k].tobytes() == v.tobytes()


def test_incompressible_frames_are_sent_raw():
    noise = {"x": np.random.default_rng(0).normal(size=10_000).astype(np.float32)}
    frames = encode("STEPS", {}, noise, compression="zstd")
    assert len(frames[1]) == noise["x"].nbytes


def _header_with(descriptor):
    import msgpack

    return msgpack.packb({"p": codec.PROTOCOL_VERSION, "k": "T", "f": {}, "a": [descriptor]})


def test_a_compression_bomb_cannot_inflate_past_the_declared_size():
    bomb = compress(bytes(50_000_000), "zstd")  # 50 MB of zeros in a few KB
    with pytest.raises(MessageError) as info:
        decode([_header_with(["x", "uint8", [1000], "zstd"]), bomb])
    assert info.value.reason == "compression"


@pytest.mark.parametrize("descriptor", [["x", "uint8", [1000], "gzip"], ["x", "uint8", [1000], 7]])
def test_unknown_codecs_and_corrupt_frames_are_refused(descriptor):
    with pytest.raises(MessageError) as info:
        decode([_header_with(descriptor), b"\x00" * 100])
    assert info.value.reason == "compression"
    with pytest.raises(MessageError):
        decode([_header_with(["x", "uint8", [1000], "lz4"]), b"\xff" * 100])


def test_adaptive_choice_follows_the_bandwidth():
    arrays = list(image_batch().values())
    fast = AdaptiveCompression("auto", trial_every=1)
    fast.note_bandwidth(1e12)  # a link faster than any codec
    assert fast.choose(arrays) is None
    slow = AdaptiveCompression("auto", trial_every=1)
    slow.note_bandwidth(1e6)  # a 1 MB/s uplink
    assert slow.choose(arrays) in ("zstd", "lz4")
    assert slow.last_trial["zstd"]["ratio"] < 0.2
    assert AdaptiveCompression("off").choose(arrays) is None
    assert AdaptiveCompression("lz4").choose(arrays) == "lz4"
