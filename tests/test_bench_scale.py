"""``embodyrl bench scale --quick``: a real learner and simulated actors over a local Ray cluster."""

import pytest

pytest.importorskip("ray", reason="Ray is the [ray] extra")
pytestmark = pytest.mark.slow


def test_quick_scale_bench_measures_the_intake_per_actor_count():
    from embodyrl.bench import scale

    out = scale.run(quick=True)
    assert out["actors"] == [1, 2, 4]
    for n, figures in out["by_actors"].items():
        assert figures["rows_stored_per_s"] > 0, n
        assert figures["learner_cpu_us_per_row"] > 0 and figures["actor_cpu_us_per_row"] > 0, n
        # the loop thread's intake is part of the learner's CPU, the update's threads the rest of it
        assert 0 < figures["intake_cpu_us_per_row"] < figures["learner_cpu_us_per_row"], n
        assert figures["intake_stage_share"]["other_threads"] > 0, n
        assert figures["policy_lag"] is not None and figures["policy_lag"] >= 0, n  # rows stamped with held weights
        ratio = figures["rows_stored_per_s"] / out["by_actors"]["1"]["rows_stored_per_s"]
        assert out["rows_stored_vs_one_actor"][n] == pytest.approx(ratio, abs=2e-3)
