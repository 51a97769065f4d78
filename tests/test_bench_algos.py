import math

import pytest

from embodyrl.bench import algos


def test_quick_algos_bench_measures_a_real_learner_against_its_bare_update():
    out = algos.run(quick=True)
    for key in ("learner_loop_updates_per_s", "bare_update_updates_per_s", "learner_loop_ratio",
                "learner_loop_update_vs_bare", "learner_loop_seconds"):
        assert math.isfinite(out[key]) and out[key] > 0, key
    # the loop runs the bare update and more: it cannot cost less CPU per update. The wall-clock
    # ratio of a few seconds of blocks moves with the machine's load (1.14 was seen at load 7), so
    # an excess there is only flagged in the JSON; a bench that times less than the loop's work
    # fails here, on this process's CPU seconds
    assert 0 < out["learner_loop_cpu_ratio"] <= 1.1
    assert out["learner_loop_bench_bug"] == (out["learner_loop_ratio"] > 1)
    assert out["learner_loop_goal_met"] == (out["learner_loop_ratio"] >= 0.95)
    # the learner took rows over the wire and trained on them at the configured ratio's settings
    assert out["learner_loop_updates_per_row"] > 0 and out["updates_per_step"] == 1.0
    assert out["updates_per_call"] == 16 and out["hidden_sizes"] == [256, 256] and out["batch_size"] == 256
    shares = {p: out[f"learner_loop_share_{p}"] for p in algos.PHASES}
    # every phase of the loop was on the clock: each one ran
    for phase in ("ingest", "commit", "sample", "update", "publish", "housekeeping"):
        assert shares[phase] > 0, phase
    # the phases are disjoint pieces of one thread's wall time: together they cover the loop
    # (what is left is its own bookkeeping), and never more than all of it
    assert 0.9 <= sum(shares.values()) <= 1.0005, shares
    assert abs(sum(shares.values()) + out["learner_loop_share_other"] - 1) < 1e-3
    # the same update split over 1, 2 and 4 forced CPU devices, measured side by side
    assert set(out["sharded_updates_per_s"]) == {"1", "2", "4"}
    assert all(rate > 0 for rate in out["sharded_updates_per_s"].values())
    for n in (2, 4):
        ratio = out["sharded_updates_per_s"][str(n)] / out["sharded_updates_per_s"]["1"]
        assert out[f"sharded_vs_one_device_{n}"] == pytest.approx(ratio, abs=2e-3)
