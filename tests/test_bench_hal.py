"""``embodyrl bench hal --quick`` runs and reports every key, finite, within physical limits."""

import math

from embodyrl import bench

RATES = (100, 500, 1000)
TAGS = ("", "_normal_priority")
KEYS = ("jitter_p99_ms_500hz", "jitter_max_ms_500hz", "missed_deadlines_500hz", "mujoco_overhead_ratio",
        "pendulum_overhead_ratio", "jitter_p99_ms_500hz_normal_priority",
        "missed_deadlines_500hz_normal_priority", "arm_hal_step_us", "arm_raw_mj_step_us",
        "naive_sleep_rate_error_500hz", "naive_sleep_period_error_p99_ms_500hz",
        "naive_over_clock_period_error_p99_500hz", "realtime_priority_granted", "loop_body_us_p50",
        "loop_body_us_p99", "loop_body_fits_1000hz", "act_us_numpy_mlp256", "act_us_jax_mlp256",
        "numpy_over_jax_act_time")
FAMILY = ("period_error_p99_ms", "period_error_max_ms", "missed_deadlines", "overrun_ms_p99", "achieved_rate_ratio")
RUN = ("p50_ms", "p99_ms", "max_ms", "missed", "overruns", "overrun_p99_ms", "overrun_max_ms", "body_us_p50",
       "body_us_p99", "rate_ratio")


def test_quick_hal_bench_reports_finite_figures():
    result = bench.run("hal", quick=True)
    for key in KEYS:
        assert key in result, key
    for tag in TAGS:
        for hz in RATES:
            for name in FAMILY:
                assert f"{name}_{hz}hz{tag}" in result, f"{name}_{hz}hz{tag}"
            assert result[f"period_error_p99_ms_{hz}hz{tag}"] <= result[f"period_error_max_ms_{hz}hz{tag}"]
            # the loop cannot run faster than its clock (overruns only ever slow it down)
            assert 0 < result[f"achieved_rate_ratio_{hz}hz{tag}"] <= 1.001
            for condition in ("idle", "loaded"):
                for stat in RUN:
                    assert f"clock_{condition}_{hz}hz_{stat}{tag}" in result
                run = {stat: result[f"clock_{condition}_{hz}hz_{stat}{tag}"] for stat in RUN}
                assert 0 <= run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
                assert run["missed"] >= run["overruns"] >= 0
                assert (run["overrun_max_ms"] > 0) == (run["overruns"] > 0)
        # the old name is the period error's, for continuity
        assert result[f"jitter_p99_ms_500hz{tag}"] == result[f"period_error_p99_ms_500hz{tag}"]
    for key, value in result.items():
        if isinstance(value, (int, float)):
            assert math.isfinite(value), key
    assert result["clock_loaded_500hz_ticks"] == 150
    assert isinstance(result["loop_body_fits_1000hz"], bool)
    assert result["mujoco_overhead_ratio"] > 0.5 and result["arm_rate_limited"] > 0
    # two 256-wide layers take some microseconds in either runtime; the ratio is of the two
    assert 1 < result["act_us_numpy_mlp256"] < 1e5 and 1 < result["act_us_jax_mlp256"] < 1e5
    assert result["numpy_over_jax_act_time"] == result["act_us_numpy_mlp256"] / result["act_us_jax_mlp256"]
