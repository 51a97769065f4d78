"""``embodyrl bench ingest --quick``: a learner host with two ingest workers against the learner ingesting
itself, CPU per row by session count, and the worked 32-core figure."""

import pytest

pytestmark = pytest.mark.slow


def test_quick_ingest_bench_measures_the_host_cpu_per_row_beside_its_baseline():
    from embodyrl.bench import ingest

    out = ingest.run(quick=True)
    assert out["sessions"] == [1, 4]
    for n, figures in out["by_sessions"].items():
        assert figures["rows_per_s"] > 0, n
        assert figures["worker_cpu_us_per_row"] > 0 and figures["learner_cpu_us_per_row"] > 0, n
        total = figures["worker_cpu_us_per_row"] + figures["learner_cpu_us_per_row"]
        assert figures["host_cpu_us_per_row"] == pytest.approx(total, abs=0.02), n
        assert out["cpu_per_row_vs_one_session"][n] == pytest.approx(
            figures["host_cpu_us_per_row"] / out["by_sessions"]["1"]["host_cpu_us_per_row"], abs=2e-3)
    for n, figures in out["baseline_learner_ingests"].items():
        assert figures["rows_per_s"] > 0 and figures["worker_cpu_us_per_row"] is None, n
    host = out["host_32_cores"]
    assert host["rows_per_s"] == min(host["rows_per_s_by_workers"], host["rows_per_s_by_learner_core"])
