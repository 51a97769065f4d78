import numpy as np
import pytest

from embodyrl import envs
from embodyrl.envs import pendulum
from embodyrl.hal.device import EStopError
from embodyrl.hal.drivers.mujoco import MujocoDevice
from embodyrl.hal.specs import SpecError

TWO_JOINTS = """
<mujoco>
  <option timestep="0.002"/>
  <worldbody>
    <body><joint name="a" type="hinge" axis="0 1 0"/><geom size="0.1" mass="1"/>
      <body pos="0 0 0.5"><joint name="b" type="slide" axis="1 0 0"/><geom size="0.1" mass="1"/></body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="a" ctrllimited="true" ctrlrange="-1 1"/>
    <motor joint="b" ctrllimited="true" ctrlrange="-3 0.5"/>
  </actuator>
</mujoco>
"""


@pytest.fixture
def device():
    with MujocoDevice(TWO_JOINTS, control_substeps=5) as d:
        yield d


def test_specs_come_from_the_model(device):
    assert device.action_spec.shape == (2,)
    np.testing.assert_array_equal(device.action_spec.minimum, [-1, -3])
    np.testing.assert_array_equal(device.action_spec.maximum, [1, 0.5])
    assert set(device.observation_spec) == {"qpos", "qvel"}
    assert device.control_period_s == pytest.approx(0.01)


def test_step_respects_actuator_limits_and_substeps(device):
    device.reset(seed=0)
    time_before = device.data.time
    observation = device.step(np.array([5.0, -10.0], np.float32))
    np.testing.assert_array_equal(device.data.ctrl, [1.0, -3.0])
    assert device.data.time == pytest.approx(time_before + 0.01)
    device.observation_spec.validate(observation)


def test_reset_is_deterministic_and_restores_state(device):
    first = device.reset(seed=0)
    for _ in range(10):
        device.step(np.array([1.0, 0.5], np.float32))
    again = device.reset(seed=0)
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])


def test_bad_actions_are_refused(device):
    device.reset()
    with pytest.raises(SpecError, match="shape"):
        device.step(np.zeros(3, np.float32))
    with pytest.raises(SpecError, match="non-finite"):
        device.step(np.array([np.nan, 0], np.float32))


def test_estop_latches_until_cleared(device):
    device.reset()
    device.estop("operator pressed the button")
    assert device.health().status == "faulted"
    with pytest.raises(EStopError):
        device.step(np.zeros(2, np.float32))
    with pytest.raises(EStopError):
        device.reset()
    device.clear_estop()
    device.reset()
    device.step(np.zeros(2, np.float32))
    assert device.health().status == "ok"


def test_not_connected_device_refuses_to_move():
    d = MujocoDevice(TWO_JOINTS)
    with pytest.raises(RuntimeError, match="not connected"):
        d.reset()


def test_sensor_observation_fields_are_named_by_sensor():
    from embodyrl.hal.drivers.mujoco import load_model, sensor_observation

    spec, observe = sensor_observation(load_model(pendulum.ASSET))
    assert list(spec) == ["angle", "angular_velocity", "qpos", "qvel"]


def test_pendulum_must_swing_up():
    device, task = envs.make("pendulum")
    with device:
        # Full torque from hanging straight down never gets the rod past horizontal.
        device.reset()
        device.data.qpos[0], device.data.qvel[0] = np.pi, 0.0
        highest = np.pi
        for _ in range(100):
            obs = device.step(np.array([2.0], np.float32))
            highest = min(highest, abs(pendulum.angle(obs)))
        assert highest > np.pi / 2
        # At rest upright with no torque, the reward is (almost) zero, elsewhere negative.
        obs = device.reset()
        device.data.qpos[0], device.data.qvel[0] = 0.0, 0.0
        upright = pendulum._observe(device.model, device.data)
        assert task.reward(upright, np.zeros(1), upright) == pytest.approx(0.0)
        assert task.reward(obs, np.zeros(1), obs) <= 0.0
    assert task.max_episode_steps == 200


def test_pendulum_upright_fraction_uses_the_second_half():
    task = pendulum.SwingUp()
    down = {"orientation": np.array([-1.0, 0.0], np.float32), "angular_velocity": np.zeros(1, np.float32)}
    up = {"orientation": np.array([1.0, 0.0], np.float32), "angular_velocity": np.zeros(1, np.float32)}
    assert task.episode_metrics([down] * 10 + [up] * 10)["upright_fraction"] == 1.0
    assert task.episode_metrics([up] * 10 + [down] * 10)["upright_fraction"] == 0.0


from embodyrl.hal.testing import DeviceConformance  # noqa: E402


class TestPendulumConformance(DeviceConformance):
    @pytest.fixture
    def device(self):
        with envs.make("pendulum")[0] as d:
            yield d


class TestArmConformance(DeviceConformance):
    @pytest.fixture
    def device(self):
        with envs.make("arm_reach")[0] as d:
            yield d


class TestGenericModelConformance(DeviceConformance):
    @pytest.fixture
    def device(self):
        with MujocoDevice(TWO_JOINTS, control_substeps=5) as d:
            yield d
