import math

from embodyrl.bench import algos


def test_quick_algos_bench_reports_the_ratio():
    out = algos.run(quick=True)
    for key in ("learner_loop_updates_per_s", "bare_update_updates_per_s", "learner_loop_ratio"):
        assert math.isfinite(out[key]) and out[key] > 0
