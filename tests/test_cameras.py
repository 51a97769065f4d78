"""Cameras: uint8 images per named MJCF camera, rendered offscreen (OSMesa here)."""

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.envs import arm
from embodyrl.hal.drivers.mujoco import MujocoDevice
from embodyrl.hal.specs import DictSpec
from embodyrl.hal.testing import DeviceConformance


@pytest.fixture
def arm_with_cameras():
    with MujocoDevice(arm.ASSET, cameras={"front": (84, 84), "wrist": (64, 48)}) as d:
        yield d


def test_each_camera_is_a_uint8_field_with_its_own_resolution(arm_with_cameras):
    spec = arm_with_cameras.observation_spec
    assert spec["camera/front"].shape == (84, 84, 3) and spec["camera/wrist"].shape == (48, 64, 3)
    assert spec["camera/front"].dtype == np.uint8
    assert spec["camera/front"].minimum.min() == 0 and spec["camera/front"].maximum.max() == 255
    assert DictSpec.from_msg(spec.to_msg()) == spec
    obs = arm_with_cameras.reset(seed=0)
    front, wrist = obs["camera/front"], obs["camera/wrist"]
    assert front.shape == (84, 84, 3) and wrist.shape == (48, 64, 3)
    assert front.std() > 5 and wrist.std() > 5  # a rendered scene, not a blank buffer
    assert not np.array_equal(front[:48, :64], wrist)  # two viewpoints


def test_images_follow_the_simulation(arm_with_cameras):
    first = arm_with_cameras.reset(seed=0)["camera/front"].astype(int)
    for _ in range(30):
        obs = arm_with_cameras.step(arm_with_cameras.action_spec.maximum.astype(np.float32))
    moved = np.abs(obs["camera/front"].astype(int) - first).mean()
    again = arm_with_cameras.reset(seed=0)["camera/front"].astype(int)
    assert moved > 0.5
    np.testing.assert_array_equal(again, first)  # same state renders the same image


def test_camera_effects_change_the_image():
    images = []
    for effects in (False, True):
        with MujocoDevice(arm.ASSET, cameras={"front": (64, 64)}, camera_effects=effects) as d:
            images.append(d.reset(seed=0)["camera/front"].astype(int))
    assert np.abs(images[0] - images[1]).sum() > 0  # shadows/reflections are drawn only when asked


def test_unknown_camera_is_named():
    with pytest.raises(ValueError, match="'top'.*front"):
        MujocoDevice(arm.ASSET, cameras={"top": (32, 32)})


def test_images_larger_than_the_default_framebuffer_render():
    with MujocoDevice(arm.ASSET, cameras={"front": (800, 60)}) as d:
        assert d.reset(seed=0)["camera/front"].shape == (60, 800, 3)


def test_pixel_task_reward_and_image():
    device, task = envs.make("pendulum_pixels")
    with device:
        obs = device.reset(seed=1)
        nxt = device.step(np.zeros(1, np.float32))
        assert obs["camera/front"].shape == (84, 84, 3)
        assert task.reward(obs, np.zeros(1), nxt) <= 0.0
        device.data.qpos[0] = 0.0
        up = device.step(np.zeros(1, np.float32))["camera/front"]
        device.data.qpos[0] = np.pi
        down = device.step(np.zeros(1, np.float32))["camera/front"]
        assert np.abs(up.astype(int) - down).sum() > 1000  # the rod's pose shows in the image


class TestPixelTaskConformance(DeviceConformance):
    steps_per_check = 2

    @pytest.fixture
    def device(self):
        with envs.make("pendulum_pixels")[0] as d:
            yield d


def test_driver_benchmark_quick_reports_finite_figures():
    from embodyrl.bench import drivers

    result = drivers.run(quick=True)
    for key in ("render_steps_per_s", "render_effects_steps_per_s", "state_steps_per_s", "render_ratio",
                "remote_steps_per_s", "local_steps_per_s", "remote_ratio",
                "numpy_actions_per_s", "jax_actions_per_s", "runtime_ratio",
                "ee_steps_per_s", "joint_steps_per_s", "ee_step_ratio", "ik_near_solve_ms"):
        assert np.isfinite(result[key]) and result[key] > 0, key
    for key in ("ik_near", "ik_far", "ik_pose"):
        assert 0.5 <= result[f"{key}_converged"] <= 1 and 0 <= result[f"{key}_error_m_p50"] < 1e-4, key
    assert result["ik_within_limits"] is True
