import importlib.util

from embodyrl.bench import BENCHMARKS, crossq


def test_quick_crossq_bench_times_the_update_and_says_where_sbx_is_missing():
    assert BENCHMARKS["crossq"] == "crossq"
    out = crossq.run(quick=True)
    assert out["crossq_update_ms_w64"] > 0 and out["sac_update_ms"] > 0
    assert abs(out["crossq_vs_sac_w64"] - out["crossq_update_ms_w64"] / out["sac_update_ms"]) <= 0.01 * out[
        "crossq_vs_sac_w64"]
    if importlib.util.find_spec("sbx") is None:  # the [compare] extra: absent, the figures say why
        assert out["sbx_crossq_update_ms_w64"] is None and out["crossq_vs_sbx_w64"] is None
        assert "pip install -e '.[compare]'" in out["sbx"]
    else:
        ratio = out["crossq_update_ms_w64"] / out["sbx_crossq_update_ms_w64"]
        assert abs(out["crossq_vs_sbx_w64"] - ratio) <= 0.01 * ratio
