"""The replay benchmark runs end to end at quick size and reports every figure the issue names."""

import math

from embodyrl.bench import replay as bench

KEYS = ("hot_sample_ratio_vs_numpy", "cold_sample_ratio_vs_numpy", "first_cold_batch_ms", "reopen_s",
        "rss_anon_over_budget_ratio", "durable_write_ratio_vs_disk", "inserts_per_s",
        "cold_bytes_read_per_batch", "cache_preferring_tv_from_uniform", "numpy_sample_ms",
        "first_cold_batch_ms_median", "cold_ceiling_ratio_vs_numpy", "maybe_commit_max_ms",
        *(f"disk_random_read_iops_qd{d}" for d in bench.QUEUE_DEPTHS), "disk_random_read_batch_ms_hinted",
        "wrap_eviction_waits", "wrap_insert_batch_ms_p99")


def test_quick_benchmark_reports_finite_figures_for_both_cases():
    out = bench.run(quick=True)
    for key in KEYS:
        for name in (key, f"image_{key}"):
            assert name in out and math.isfinite(out[name]), name
    assert out["rows"] == 20_000 and out["image_rows"] == 4_000
    assert 0 < out["cache_preferring_tv_from_uniform"] < 1
