"""The safety layer around real MuJoCo devices and a recording device: limits, watchdog, e-stop."""

import threading
import time

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.hal.device import Device, EStopError
from embodyrl.hal.safety import BoxLimit, SafeDevice, SafetyConfig
from embodyrl.hal.specs import ArraySpec, DictSpec, SpecError
from embodyrl.hal.testing import DeviceConformance
from embodyrl.hal.watchdog import Watchdog

WATCHDOG_S = 0.05
TOLERANCE_S = 0.03  # thread wake-up on a loaded 2-core machine; the measured lag is reported


class RecordingArm(Device):
    """A 3-joint position-commanded device that logs every command with its time."""

    observation_spec = DictSpec.of(ArraySpec("qpos", (3,), np.float32))
    action_spec = ArraySpec("action", (3,), np.float32, -1.0, 1.0)
    control_period_s = 0.01

    def __init__(self):
        super().__init__()
        self.commands: list[tuple[float, np.ndarray]] = []
        self.qpos = np.zeros(3, np.float32)
        self.fail_next = False

    def _reset(self, seed):
        self.qpos = np.zeros(3, np.float32)
        return {"qpos": self.qpos.copy()}

    def _step(self, action):
        if self.fail_next:
            self.fail_next = False
            raise OSError("bus timeout")
        self.commands.append((time.monotonic(), action.copy()))
        self.qpos = self.qpos + action
        return {"qpos": self.qpos.copy()}


class TestSafeMujocoArm(DeviceConformance):
    @pytest.fixture
    def device(self):
        raw, _ = envs.make("arm_reach")
        with SafeDevice(raw, SafetyConfig(max_delta=0.5, watchdog_s=0.5)) as d:
            yield d


def test_clipping_and_rate_limits_hold_on_the_arm():
    raw, _ = envs.make("arm_reach")
    high = raw.action_spec.maximum.astype(np.float32)
    max_delta = 0.25
    with SafeDevice(raw, SafetyConfig(max_delta=max_delta)) as arm:
        arm.reset(seed=0)
        rng = np.random.default_rng(0)
        previous = None
        for _ in range(200):
            proposed = rng.uniform(-3 * high, 3 * high).astype(np.float32)
            arm.step(proposed)
            applied = arm.last_applied
            assert (np.abs(applied) <= high + 1e-6).all()
            np.testing.assert_array_equal(raw.data.ctrl.astype(np.float32), applied)
            if previous is not None:
                assert (np.abs(applied - previous) <= max_delta + 1e-6).all()
            previous = applied
        assert arm.interventions["clipped"] > 150
        assert arm.interventions["rate_limited"] > 150
        arm.reset(seed=0)  # a reset forgets the last action: no rate limit on the first step
        arm.step(high)
        np.testing.assert_array_equal(arm.last_applied, high)


def test_bad_config_is_refused_with_the_field_named():
    raw, _ = envs.make("pendulum")
    with pytest.raises(ValueError, match="max_delta"):
        SafeDevice(raw, SafetyConfig(max_delta=0.0))
    with pytest.raises(ValueError, match="safe_action"):
        SafeDevice(raw, SafetyConfig(safe_action=(5.0,)))
    with pytest.raises(ValueError, match="watchdog_s"):
        SafeDevice(raw, SafetyConfig(watchdog_s=-1))


def test_workspace_limit_commands_the_safe_action_and_repeated_faults_latch():
    arm = RecordingArm()
    box = BoxLimit("qpos", -0.5, 0.5)
    with SafeDevice(arm, SafetyConfig(workspace=box, estop_after_faults=3)) as safe:
        safe.reset()
        safe.step(np.full(3, 0.4, np.float32))      # inside: applied as proposed
        safe.step(np.full(3, 0.4, np.float32))      # o_t inside, moves to 0.8: allowed
        assert safe.interventions["workspace"] == 0
        safe.step(np.full(3, 0.4, np.float32))      # o_t outside: safe action (zeros)
        np.testing.assert_array_equal(arm.commands[-1][1], np.zeros(3))
        assert safe.interventions["workspace"] == 1 and safe.health().status == "degraded"
        safe.step(np.full(3, 0.4, np.float32))
        assert not safe.estopped
        safe.step(np.full(3, 0.4, np.float32))      # third fault in a row
        assert safe.estopped and arm.estopped
        assert "consecutive faults" in safe.health().reason
        with pytest.raises(EStopError):
            safe.step(np.zeros(3, np.float32))
        safe.clear_estop()
        assert not arm.estopped
        safe.reset()
        safe.step(np.zeros(3, np.float32))
        assert safe.health().status == "ok"


def test_driver_errors_count_as_faults_and_propagate():
    arm = RecordingArm()
    with SafeDevice(arm, SafetyConfig(estop_after_faults=2)) as safe:
        safe.reset()
        for _ in range(2):
            arm.fail_next = True
            with pytest.raises(OSError, match="bus timeout"):
                safe.step(np.zeros(3, np.float32))
        assert safe.interventions["device_error"] == 2
        assert safe.estopped


def test_malformed_proposals_raise_and_apply_nothing():
    arm = RecordingArm()
    with SafeDevice(arm, SafetyConfig()) as safe:
        safe.reset()
        with pytest.raises(SpecError, match="action"):
            safe.step(np.array([np.nan, 0, 0], np.float32))
        with pytest.raises(SpecError, match="shape"):
            safe.step(np.zeros(4, np.float32))
        assert arm.commands == []


def test_watchdog_fires_within_its_deadline_when_the_policy_stalls():
    arm = RecordingArm()
    config = SafetyConfig(safe_action=(0.0, 0.0, 0.0), watchdog_s=WATCHDOG_S, estop_after_faults=0)
    with SafeDevice(arm, config) as safe:
        safe.reset()
        lags = []
        for _ in range(5):
            safe.step(np.full(3, 0.3, np.float32))
            last_step = arm.commands[-1][0]
            time.sleep(WATCHDOG_S * 1.5)                # the policy stalls
            fired = [t for t, a in arm.commands if t > last_step]
            assert fired, "the watchdog did not command anything"
            np.testing.assert_array_equal(arm.commands[-1][1], np.zeros(3))
            lags.append(fired[0] - last_step)
        lags = np.array(lags)
        print(f"watchdog fired {1e3 * (lags - WATCHDOG_S)} ms after its deadline")
        assert (lags >= WATCHDOG_S * 0.999).all(), "fired before the deadline"
        assert (lags <= WATCHDOG_S + TOLERANCE_S).all(), f"fired late: {lags}"
        assert safe.interventions["watchdog"] >= 5


def test_watchdog_stays_quiet_while_steps_arrive_in_time():
    arm = RecordingArm()
    with SafeDevice(arm, SafetyConfig(watchdog_s=WATCHDOG_S)) as safe:
        safe.reset()
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            safe.step(np.full(3, 0.01, np.float32))
            time.sleep(WATCHDOG_S / 10)
        assert safe.interventions["watchdog"] == 0


def test_a_stalled_loop_latches_the_estop_after_repeated_watchdog_faults():
    arm = RecordingArm()
    with SafeDevice(arm, SafetyConfig(watchdog_s=0.02, estop_after_faults=3)) as safe:
        safe.reset()
        safe.step(np.full(3, 0.5, np.float32))
        deadline = time.monotonic() + 2.0
        while not safe.estopped and time.monotonic() < deadline:
            time.sleep(0.005)
        assert safe.estopped and arm.estopped
        assert safe.interventions["watchdog"] == 3
        assert safe.interventions["estop"] == 1
        time.sleep(0.1)
        assert safe.interventions["watchdog"] == 3, "kept commanding after the e-stop"
        with pytest.raises(EStopError):
            safe.step(np.zeros(3, np.float32))


def test_watchdog_and_control_loop_never_step_the_device_at_once():
    """A lock serialises the watchdog's command and the loop's step."""

    class Slow(RecordingArm):
        inside = 0
        overlap = False

        def _step(self, action):
            Slow.inside += 1
            Slow.overlap |= Slow.inside > 1
            time.sleep(0.004)
            Slow.inside -= 1
            return super()._step(action)

    arm = Slow()
    with SafeDevice(arm, SafetyConfig(watchdog_s=0.005, estop_after_faults=0)) as safe:
        safe.reset()
        for i in range(60):
            safe.step(np.zeros(3, np.float32))
            time.sleep(0.004 * (i % 3))
        assert safe.interventions["watchdog"] > 0
        assert not Slow.overlap


def test_watchdog_thread_stops_with_the_device():
    before = threading.active_count()
    with SafeDevice(RecordingArm(), SafetyConfig(watchdog_s=0.01)) as safe:
        safe.reset()
        assert threading.active_count() == before + 1
    assert threading.active_count() == before


def test_bare_watchdog_refires_once_per_deadline_and_reports_errors():
    calls = []

    def on_timeout():
        calls.append(time.monotonic())
        raise RuntimeError("motor offline")

    dog = Watchdog(0.02, on_timeout)
    dog.start()
    try:
        dog.kick()
        time.sleep(0.11)
    finally:
        dog.stop()
    assert 3 <= dog.fired <= 6
    assert dog.errors and "motor offline" in dog.errors[0]
    assert np.diff(calls).min() >= 0.019
