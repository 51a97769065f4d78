import math

from embodyrl.bench import BENCHMARKS, hetero


def test_quick_hetero_bench_times_headed_against_single_device_networks():
    assert BENCHMARKS["hetero"] == "hetero"
    out = hetero.run(quick=True)
    for key in ("hetero_update_ms", "single_update_ms", "hetero_update_ratio",
                "hetero_act_ms", "single_act_ms", "hetero_act_ratio"):
        assert math.isfinite(out[key]) and out[key] > 0, key
    ratio = out["hetero_update_ms"] / out["single_update_ms"]  # the ratio is of the two figures it reports
    assert abs(out["hetero_update_ratio"] - ratio) <= 0.01 * ratio
    assert out["device_kinds"] == 2 and out["batch_size"] == 16
