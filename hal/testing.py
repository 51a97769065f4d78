"""A conformance suite every device driver passes by providing one fixture.

In the driver's test module::

    from embodyrl.hal.testing import DeviceConformance

    class TestMyArm(DeviceConformance):
        @pytest.fixture
        def device(self):
            with MyArm(...) as d:
                yield d

and pytest runs every check below against it. Set ``deterministic_reset =
False`` for hardware that cannot be reset to the same state twice.
"""

from __future__ import annotations

import numpy as np
import pytest

from .device import Device, EStopError
from .specs import ArraySpec, DictSpec, SpecError


def _actions(spec: ArraySpec, rng: np.random.Generator):
    lo = np.where(np.isfinite(spec.minimum), spec.minimum, -1.0) if spec.minimum is not None else -np.ones(spec.shape)
    hi = np.where(np.isfinite(spec.maximum), spec.maximum, 1.0) if spec.maximum is not None else np.ones(spec.shape)
    yield np.clip(np.zeros(spec.shape), lo, hi).astype(spec.dtype)
    yield lo.astype(spec.dtype)
    yield hi.astype(spec.dtype)
    for _ in range(3):
        yield rng.uniform(lo, hi).astype(spec.dtype)


class DeviceConformance:
    """Checks of the :class:`~embodyrl.hal.device.Device` contract."""

    deterministic_reset = True
    steps_per_check = 5

    def test_specs_are_well_formed(self, device: Device):
        assert isinstance(device.observation_spec, DictSpec) and len(device.observation_spec) > 0
        assert isinstance(device.action_spec, ArraySpec)
        assert device.control_period_s > 0
        assert DictSpec.from_msg(device.observation_spec.to_msg()) == device.observation_spec
        assert ArraySpec.from_msg(device.action_spec.to_msg()) == device.action_spec

    def test_reset_and_step_return_valid_observations(self, device: Device):
        device.observation_spec.validate(device.reset(seed=0))
        for action in _actions(device.action_spec, np.random.default_rng(0)):
            for _ in range(self.steps_per_check):
                device.observation_spec.validate(device.step(action))
        assert device.health().status in ("ok", "degraded")

    def test_reset_with_a_seed_is_reproducible(self, device: Device):
        if not self.deterministic_reset:
            pytest.skip("hardware reset is not deterministic")
        first = device.reset(seed=3)
        device.step(next(_actions(device.action_spec, np.random.default_rng(0))))
        again = device.reset(seed=3)
        for name in first:
            np.testing.assert_array_equal(first[name], again[name], err_msg=name)

    def test_bad_actions_raise_spec_errors_and_do_not_move(self, device: Device):
        device.reset(seed=0)
        spec = device.action_spec
        wrong_shape = np.zeros((*spec.shape, 2), spec.dtype)
        with pytest.raises(SpecError, match=spec.name):
            device.step(wrong_shape)
        if spec.dtype.kind == "f":
            nan = np.zeros(spec.shape, spec.dtype)
            nan.reshape(-1)[0] = np.nan
            with pytest.raises(SpecError, match=spec.name):
                device.step(nan)

    def test_estop_latches_until_cleared(self, device: Device):
        device.reset(seed=0)
        device.estop("conformance test")
        assert device.estopped
        assert device.health().status == "faulted"
        zero = next(_actions(device.action_spec, np.random.default_rng(0)))
        with pytest.raises(EStopError):
            device.step(zero)
        with pytest.raises(EStopError):
            device.reset()
        device.clear_estop()
        device.reset(seed=0)
        device.step(zero)

    def test_close_is_idempotent_and_reconnect_works(self, device: Device):
        device.close()
        device.close()
        with pytest.raises(RuntimeError, match="not connected"):
            device.reset()
        device.connect()
        device.observation_spec.validate(device.reset(seed=0))
