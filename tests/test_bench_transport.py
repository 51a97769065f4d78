import math

from embodyrl.bench import transport


def test_quick_transport_bench_reports_every_figure_with_its_baseline():
    out = transport.run(quick=True)
    for key in ("large_batch_mb_per_s", "raw_pyzmq_mb_per_s", "pickle_zmq_mb_per_s", "large_batch_ratio_vs_raw",
                "large_batch_ratio_vs_raw_first_fill", "large_batch_ratio_vs_raw_inline_writes", "speedup_vs_pickle",
                "large_batch_receiver_cpu_ms", "raw_receiver_cpu_ms", "large_batch_sender_cpu_ms", "raw_sender_cpu_ms", "transitions_per_s_4_actors",
                "learner_cpu_ms_per_batch", "sender_cpu_ms_per_batch", "cores_for_1m_rows_per_s",
                "sparse_1pct_size_ratio"):
        assert math.isfinite(out[key]) and out[key] > 0, key
    assert out["sparse_1pct_size_ratio"] > 40  # size, not speed: deterministic
