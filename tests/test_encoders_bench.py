import math

import pytest

from embodyrl.bench import BENCHMARKS, pixels


@pytest.mark.slow  # two compilations of the pixel SAC update: about a minute on 2 busy cores
def test_quick_pixels_bench_reports_update_and_actor_costs():
    assert BENCHMARKS["pixels"] == "pixels"
    out = pixels.run(quick=True)
    for key in ("pixel_update_ms", "pixel_update_plain_conv_grad_ms", "pixel_update_speedup",
                "pixel_env_step_ms", "state_env_step_ms", "pixel_env_step_over_state",
                "pixel_jax_act_ms", "pixel_numpy_act_ms"):
        assert math.isfinite(out[key]) and out[key] > 0, key
    assert out["pixel_image_shape"] == [32, 32, 3] and out["pixel_updates_per_call"] == 2
