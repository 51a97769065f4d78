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
        upright = pendulum.observe(device.model, device.data)
        assert task.reward(upright, np.zeros(1), upright) == pytest.approx(0.0)
        assert task.reward(obs, np.zeros(1), obs) <= 0.0
    assert task.max_episode_steps == 200


def test_pendulum_upright_fraction_uses_the_second_half():
    task = pendulum.SwingUp()
    down = {"orientation": np.array([-1.0, 0.0], np.float32), "angular_velocity": np.zeros(1, np.float32)}
    up = {"orientation": np.array([1.0, 0.0], np.float32), "angular_velocity": np.zeros(1, np.float32)}
    assert task.episode_metrics([down] * 10 + [up] * 10)["upright_fraction"] == 1.0
    assert task.episode_metrics([up] * 10 + [down] * 10)["upright_fraction"] == 0.0


def test_pendulum_angle_error_median_sees_a_pole_held_still_off_the_top():
    task = pendulum.SwingUp()

    def at(theta):
        return {"orientation": np.array([np.cos(theta), np.sin(theta)], np.float32),
                "angular_velocity": np.zeros(1, np.float32)}

    held_off = task.episode_metrics([at(np.pi)] * 10 + [at(-0.214)] * 10)
    assert held_off["upright_fraction"] == 0.0 and held_off["angle_error_median"] == pytest.approx(0.214, abs=1e-5)
    wobbling = task.episode_metrics([at(np.pi)] * 10 + [at(0.01), at(-0.02), at(0.03), at(0.5), at(-0.01)] * 2)
    assert wobbling["angle_error_median"] == pytest.approx(0.02, abs=1e-5)  # one swing out does not move it


def test_evaluation_keeps_a_median_metric_a_median_over_episodes():
    from embodyrl.cli.evaluate import summarise

    summary = summarise({"upright_fraction": [1.0, 1.0, 0.0], "angle_error_median": [0.01, 0.02, 3.0]})
    assert summary == {"upright_fraction_mean": pytest.approx(2 / 3), "angle_error_median": 0.02}


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


# -- domain randomisation ---------------------------------------------------
from embodyrl.hal.drivers.mujoco import Randomization  # noqa: E402


def _randomized(**ranges):
    return MujocoDevice(TWO_JOINTS, control_substeps=5, randomization=Randomization(**ranges))


def test_randomization_scales_from_nominal_at_every_reset_without_drift():
    with _randomized(mass_scale=(0.5, 2.0), friction_scale=(0.2, 0.4),
                     actuator_gain_scale=(1.5, 3.0)) as d:
        mass, friction, gain = d.model.body_mass.copy(), d.model.geom_friction.copy(), d.model.actuator_gainprm[:, 0].copy()
        draws = []
        for seed in range(40):
            d.reset(seed=seed)
            m = d.model.body_mass[1:] / mass[1:]
            f = d.model.geom_friction / friction
            g = d.model.actuator_gainprm[:, 0] / gain
            assert ((m >= 0.5) & (m <= 2.0)).all() and ((f >= 0.2) & (f <= 0.4)).all()
            assert ((g >= 1.5) & (g <= 3.0)).all()
            draws.append(m[0])
        assert np.std(draws) > 0.1  # resampled each reset, not drawn once
        first = d.reset(seed=7) and d.model.body_mass.copy()
        d.reset(seed=8)
        d.reset(seed=7)
        np.testing.assert_array_equal(d.model.body_mass, first)


def test_randomized_gain_changes_behaviour():
    def swing(device):
        with device:
            device.reset(seed=0)
            for _ in range(20):
                obs = device.step(np.array([1.0, 0.0], np.float32))
            return obs["qpos"][0]

    nominal = swing(MujocoDevice(TWO_JOINTS, control_substeps=5))
    strong = swing(_randomized(actuator_gain_scale=(2.0, 2.0)))
    heavy = swing(_randomized(mass_scale=(3.0, 3.0)))
    assert abs(strong) > 1.5 * abs(nominal) and abs(heavy) < abs(nominal)


def test_observation_noise_perturbs_float_fields():
    with MujocoDevice(TWO_JOINTS) as clean, _randomized(observation_noise_std=0.01) as noisy:
        a, b = clean.reset(seed=0), noisy.reset(seed=0)
        diff = np.abs(a["qvel"] - b["qvel"])
        assert (diff > 0).all() and (diff < 0.1).all()


def test_action_latency_delays_the_command_by_whole_control_steps():
    with _randomized(action_latency_steps=(2, 2)) as d:
        d.reset(seed=0)
        assert d.action_latency_steps == 2
        commands = [np.array([0.1 * (i + 1), 0.0], np.float32) for i in range(5)]
        applied = []
        for action in commands:
            d.step(action)
            applied.append(d.data.ctrl[0])
        np.testing.assert_allclose(applied, [0.0, 0.0, 0.1, 0.2, 0.3], atol=1e-6)
    with _randomized(action_latency_steps=(0, 3)) as d:
        assert {d.reset(seed=s) and d.action_latency_steps for s in range(30)} == {0, 1, 2, 3}


@pytest.mark.parametrize("bad", [dict(mass_scale=(0.0, 1.0)), dict(friction_scale=(2.0, 1.0)),
                                 dict(action_latency_steps=(0.5, 1)), dict(observation_noise_std=-1.0)])
def test_bad_randomization_names_the_field(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Randomization(**bad)


class TestRandomizedArmConformance(DeviceConformance):
    @pytest.fixture
    def device(self):
        from embodyrl.envs import arm

        device = arm.make_device()
        device.randomization = Randomization(mass_scale=(0.8, 1.2), friction_scale=(0.5, 1.5),
                                             actuator_gain_scale=(0.9, 1.1), observation_noise_std=0.01,
                                             action_latency_steps=(0, 2))
        with device as d:
            yield d


SLIDING_BOX = """
<mujoco>
  <option timestep="0.002"/>
  <worldbody>
    <geom type="plane" size="5 5 0.1" friction="0.5"/>
    <body pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1" mass="1" friction="0.5"/></body>
  </worldbody>
</mujoco>
"""


def test_randomized_friction_changes_how_far_a_box_slides():
    def slide(scale):
        def push(model, data, rng):
            data.qvel[0] = 2.0

        with MujocoDevice(SLIDING_BOX, control_substeps=50, reset_fn=push,
                          randomization=Randomization(friction_scale=(scale, scale))) as d:
            d.reset(seed=0)
            for _ in range(30):
                obs = d.step(np.zeros(0, np.float32))
            return float(obs["qpos"][0])

    nominal, slippery, grippy = slide(1.0), slide(0.5), slide(2.0)
    assert slippery > 1.5 * nominal and grippy < 0.75 * nominal
