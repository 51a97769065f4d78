import math

import pytest

pytest.importorskip("starlette")
pytest.importorskip("PIL")

from embodyrl.bench import BENCHMARKS, console  # noqa: E402


def test_quick_console_bench_measures_estops_and_the_loop_with_and_without_the_stream():
    assert BENCHMARKS["console"] == "console"
    out = console.run(quick=True)
    assert out["console_estop_requests"] == 10
    assert 0 < out["console_estop_ms_p50"] <= out["console_estop_ms_p95"] <= out["console_estop_ms_max"]
    assert out["console_estop_ms_p95"] <= out["console_estop_roundtrip_ms_p95"] + 1  # within the client's wait
    for name in ("with_stream", "without_stream"):
        assert out[f"control_ticks_{name}"] > 100, name
        assert math.isfinite(out[f"control_period_error_p99_ms_{name}"])
    assert out["frames_sent"] > 0  # the stream was on in its blocks
    ratio = out["control_period_error_p99_ms_with_stream"] / out["control_period_error_p99_ms_without_stream"]
    assert abs(out["control_period_error_p99_ratio"] - ratio) <= 0.01 * ratio + 1e-3
