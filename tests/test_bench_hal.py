"""``embodyrl bench hal --quick`` runs and reports every key, finite."""

import math

from embodyrl import bench

KEYS = ("jitter_p99_ms_500hz", "missed_deadlines_500hz", "mujoco_overhead_ratio",
        "pendulum_overhead_ratio", "jitter_p99_ms_500hz_normal_priority",
        "missed_deadlines_500hz_normal_priority", "arm_hal_step_us", "arm_raw_mj_step_us",
        "naive_sleep_rate_error_500hz")


def test_quick_hal_bench_reports_finite_figures():
    result = bench.run("hal", quick=True)
    for key in KEYS:
        assert key in result, key
    for condition in ("idle", "loaded"):
        for hz in (100, 500, 1000):
            for stat in ("p50_ms", "p99_ms", "max_ms", "missed"):
                assert f"clock_{condition}_{hz}hz_{stat}" in result
    for key, value in result.items():
        if isinstance(value, (int, float)):
            assert math.isfinite(value), key
    assert result["clock_loaded_500hz_ticks"] == 150
    assert result["mujoco_overhead_ratio"] > 0.5 and result["arm_rate_limited"] > 0
