import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embodyrl.hal.wire import weights as W
from embodyrl.hal.wire.codec import decode, encode


def random_tree(rng, dtype=np.float32):
    shapes = {"actor/layers/0/kernel": (17, 64), "actor/layers/0/bias": (64,),
              "actor/layers/1/kernel": (64, 6), "actor/layers/1/bias": (6,), "scalar": ()}
    return {k: rng.normal(size=s).astype(dtype) for k, s in shapes.items()}


def perturb(tree, rng, fraction):
    out = {}
    for k, v in tree.items():
        flat = v.copy().reshape(-1)
        mask = rng.random(flat.size) < fraction
        flat[mask] = (flat[mask].astype(np.float32) + rng.normal(size=mask.sum())).astype(v.dtype)
        out[k] = flat.reshape(v.shape)
    return out


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(0, 2**31), st.sampled_from(["float32", "bfloat16", "float64"]))
def test_delta_reconstruction_is_bit_exact(fraction, seed, dtype_name):
    rng = np.random.default_rng(seed)
    dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.dtype(dtype_name)
    base = random_tree(rng, dtype)
    new = perturb(base, rng, fraction)
    delta = W.encode_delta(base, new)
    # through the real codec, as it travels
    rebuilt = W.apply_delta(base, decode(encode("WEIGHTS", {}, delta)).arrays)
    assert W.checksum(rebuilt) == W.checksum(new)
    for k in new:
        assert rebuilt[k].tobytes() == new[k].tobytes()


def test_nan_payloads_and_negative_zero_survive():
    base = {"w": np.array([0.0, 1.0, np.nan, 2.0], np.float32)}
    new = {"w": np.array([-0.0, 1.0, np.float32(np.nan), np.inf], np.float32)}
    new["w"].view(np.uint32)[2] = 0x7FC00001  # a different NaN payload
    rebuilt = W.apply_delta(base, W.encode_delta(base, new))
    assert rebuilt["w"].tobytes() == new["w"].tobytes()


def test_one_percent_delta_is_much_smaller_than_full():
    rng = np.random.default_rng(0)
    base = {"w": rng.normal(size=(1000, 1000)).astype(np.float32)}
    new = perturb(base, rng, 0.01)
    assert W.nbytes(new) / W.nbytes(W.encode_delta(base, new)) >= 40


def test_dense_change_uses_the_bitmask_and_stays_exact():
    rng = np.random.default_rng(1)
    base = random_tree(rng)
    new = perturb(base, rng, 0.9)
    delta = W.encode_delta(base, new)
    assert any(k.endswith("#mask") for k in delta)
    assert W.checksum(W.apply_delta(base, delta)) == W.checksum(new)
    assert W.density(base, new) == pytest.approx(0.9, abs=0.05)


def test_bad_deltas_are_refused():
    base = {"w": np.zeros(10, np.float32)}
    with pytest.raises(W.WeightsError, match="out of range"):
        W.apply_delta(base, {"w#idx": np.array([10], np.uint32), "w#val": np.ones(1, np.float32)})
    with pytest.raises(W.WeightsError, match="values"):
        W.apply_delta(base, {"w#idx": np.array([1, 2], np.uint32), "w#val": np.ones(1, np.float32)})
    with pytest.raises(W.WeightsError, match="no values"):
        W.apply_delta(base, {"w#idx": np.array([1], np.uint32)})
    with pytest.raises(W.WeightsError, match="do not match"):
        W.apply_delta(base, {"w#idx": np.array([1], np.uint32), "w#val": np.ones(1, np.float32),
                             "v#val": np.ones(1, np.float32)})
    with pytest.raises(W.WeightsError, match="same arrays"):
        W.encode_delta(base, {"v": np.zeros(10, np.float32)})


def test_checksum_sees_every_bit_and_ignores_order():
    a = {"x": np.zeros(4, np.float32), "y": np.ones(2, np.float32)}
    assert W.checksum(a) == W.checksum(dict(reversed(list(a.items()))))
    b = {"x": a["x"].copy(), "y": a["y"].copy()}
    b["x"].view(np.uint32)[3] ^= 1
    assert W.checksum(a) != W.checksum(b)


@pytest.mark.parametrize(("encoding", "tolerance"), [("bf16", 1e-2), ("int8", 1e-2)])
def test_quantised_weights_are_close_and_smaller(encoding, tolerance):
    rng = np.random.default_rng(2)
    tree = random_tree(rng)
    q = W.quantize(tree, encoding)
    assert W.nbytes(q) < 0.55 * W.nbytes(tree)
    back = W.dequantize(decode(encode("W", {}, q)).arrays, {k: v.dtype for k, v in tree.items()})
    for k, v in tree.items():
        scale = max(float(np.abs(v).max()), 1e-6)
        assert np.max(np.abs(back[k] - v)) <= tolerance * scale
        assert back[k].dtype == v.dtype
