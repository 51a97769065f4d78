import ml_dtypes
import numpy as np
import pytest

from embodyrl.hal.dtypes import SUPPORTED_DTYPES, dtype_from_name
from embodyrl.hal.specs import ArraySpec, DictSpec, SpecError, bounded

ACTION = bounded("action", (2,), np.float32, -1.0, 1.0)
OBS = DictSpec.of(ArraySpec("joint", (3,), np.float32), ArraySpec("image", (4, 4, 3), np.uint8, 0, 255))


def test_valid_values_pass_unchanged():
    value = np.array([0.5, -0.5], np.float32)
    assert ACTION.validate(value, check_bounds=True) is value
    obs = {"joint": np.zeros(3, np.float32), "image": np.zeros((4, 4, 3), np.uint8)}
    assert set(OBS.validate(obs)) == {"joint", "image"}


@pytest.mark.parametrize(("value", "message"), [
    (np.zeros(3, np.float32), "action: shape (3,) where (2,)"),
    (np.zeros(2, np.float64), "action: dtype float64 where float32"),
    (np.array([np.nan, 0], np.float32), "action: non-finite value nan at flat index 0"),
    (np.array([0, np.inf], np.float32), "action: non-finite value inf at flat index 1"),
    (np.array([0, 2], np.float32), "action: value above maximum"),
    (np.array([-2, 0], np.float32), "action: value below minimum"),
    ("fast", "action: expected an array, got str"),
])
def test_bad_actions_are_named(value, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ACTION.validate(value, check_bounds=True)


def test_bounds_only_checked_when_asked():
    ACTION.validate(np.array([0, 5], np.float32))


def test_dict_spec_names_missing_and_extra_fields():
    with pytest.raises(SpecError, match=r"missing \['image'\], unexpected \['depth'\]"):
        OBS.validate({"joint": np.zeros(3, np.float32), "depth": np.zeros(1)})
    with pytest.raises(SpecError, match="image: dtype float32"):
        OBS.validate({"joint": np.zeros(3, np.float32), "image": np.zeros((4, 4, 3), np.float32)})


def test_batch_validation_checks_leading_length():
    ACTION.validate_batch(np.zeros((5, 2), np.float32), 5)
    with pytest.raises(SpecError, match=r"shape \(4, 2\) where \(5, 2\)"):
        ACTION.validate_batch(np.zeros((4, 2), np.float32), 5)


@pytest.mark.parametrize("name", SUPPORTED_DTYPES)
def test_every_dtype_round_trips_through_msgpack_form(name):
    spec = ArraySpec("x", (2, 3), dtype_from_name(name), 0, 1)
    assert ArraySpec.from_msg(spec.to_msg()) == spec


def test_bfloat16_nan_is_rejected():
    spec = ArraySpec("x", (2,), ml_dtypes.bfloat16)
    with pytest.raises(SpecError, match="non-finite"):
        spec.validate(np.array([1, np.nan], ml_dtypes.bfloat16))


def test_dict_spec_round_trip_and_order():
    again = DictSpec.from_msg(OBS.to_msg())
    assert again == OBS
    assert list(again) == ["image", "joint"]


@pytest.mark.parametrize("msg", [
    {"name": "x", "shape": [2], "dtype": "object"},
    {"name": "x", "shape": [2], "dtype": "float32", "minimum": [0, 1, 2]},
    {"name": "x", "shape": ["2"], "dtype": "float32"},
    {"shape": [2], "dtype": "float32"},
    {"name": "x", "shape": [2], "dtype": "float32", "minimum": 1, "maximum": 0},
])
def test_malformed_spec_messages_raise_spec_error(msg):
    with pytest.raises(SpecError):
        ArraySpec.from_msg(msg)


def test_unsupported_dtype_is_refused():
    with pytest.raises(ValueError, match="unsupported dtype"):
        ArraySpec("x", (1,), np.complex64)


def test_uniform_bounds_travel_as_one_number():
    import msgpack

    image = ArraySpec("camera", (480, 640, 3), np.uint8, 0, 255)
    assert len(msgpack.packb(image.to_msg())) < 200  # fits any handshake
    assert ArraySpec.from_msg(image.to_msg()) == image
    varied = ArraySpec("joints", (3,), np.float32, [-1, -2, -3], [1, 2, np.inf])
    assert ArraySpec.from_msg(varied.to_msg()) == varied


def test_uniform_samples_of_an_integer_spec_reach_both_bounds():
    spec = ArraySpec("choice", (), np.int64, 0, 2)
    rng = np.random.default_rng(0)
    assert {int(spec.sample_uniform(rng)) for _ in range(200)} == {0, 1, 2}
