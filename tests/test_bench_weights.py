"""``embodyrl bench weights``: bytes per publication from a real (quick) pendulum run."""

from __future__ import annotations

import pytest

from embodyrl import bench
from embodyrl.bench import weights

KEYS = (
    "algorithm", "updates", "publications", "publish_every", "updates_per_call", "hidden_sizes",
    "actor_parameters", "changed_fraction_mean", "changed_fraction_min", "changed_fraction_max",
    "weights_fp32_bytes_per_publish", "weights_auto_bytes_per_publish",
    "weights_bytes_per_publish_ratio_vs_fp32", "auto_encodings",
    "weights_delta_bytes_per_publish", "weights_delta_ratio_vs_fp32",
    "weights_bf16_bytes_per_publish", "weights_bf16_ratio_vs_fp32",
    "weights_int8_bytes_per_publish", "weights_int8_ratio_vs_fp32",
    "control_hz", "publications_per_s", "weights_auto_kbit_per_s", "weights_fp32_kbit_per_s",
    "weights_bf16_kbit_per_s", "weights_int8_kbit_per_s", "note",
)


@pytest.fixture(scope="module")
def trained():
    return weights.run(quick=True)


@pytest.fixture(scope="module")
def frozen():
    return weights.run(quick=True, learning_rate=0.0, fan_out=False)


def test_registered():
    assert "weights" in bench.names()


def test_every_key(trained):
    missing = [k for k in KEYS if k not in trained]
    assert not missing, missing
    assert trained["publications"] == trained["updates"] // trained["publish_every"]
    assert sum(trained["auto_encodings"].values()) == trained["publications"]


def test_adam_changes_nearly_every_weight_so_auto_sends_full(trained):
    assert trained["changed_fraction_min"] > 0.5
    assert trained["auto_encodings"] == {"full": trained["publications"]}
    assert trained["weights_auto_bytes_per_publish"] == trained["weights_fp32_bytes_per_publish"]
    assert trained["weights_bytes_per_publish_ratio_vs_fp32"] == 1.0
    # a lossless delta of dense changes is larger than the weights it replaces
    assert trained["weights_delta_ratio_vs_fp32"] < 1.0
    # lossy full weights: bf16 about half, int8 about a quarter (the header is not shrunk)
    assert 1.5 < trained["weights_bf16_ratio_vs_fp32"] <= 2.0
    assert 2.0 < trained["weights_int8_ratio_vs_fp32"] <= 4.0
    assert trained["weights_int8_kbit_per_s"] < trained["weights_bf16_kbit_per_s"] < trained["weights_fp32_kbit_per_s"]


def test_the_figure_follows_the_learning_rate(trained, frozen):
    # lr 0: the real update leaves every published weight bit for bit; auto sends empty deltas
    assert frozen["changed_fraction_max"] == 0.0
    assert frozen["auto_encodings"] == {"delta": frozen["publications"]}
    assert frozen["weights_auto_bytes_per_publish"] < 0.2 * frozen["weights_fp32_bytes_per_publish"]
    assert frozen["weights_bytes_per_publish_ratio_vs_fp32"] > 5
    # the full-weight encodings do not depend on what changed
    for key in ("weights_fp32_bytes_per_publish", "weights_bf16_bytes_per_publish",
                "weights_int8_bytes_per_publish"):
        assert frozen[key] == trained[key]
    assert trained["changed_fraction_mean"] > 0.5 > frozen["changed_fraction_mean"]
    assert trained["weights_auto_bytes_per_publish"] > 5 * frozen["weights_auto_bytes_per_publish"]


def test_through_a_relay_the_learner_sends_each_publication_once_however_many_actors(trained):
    fan = trained["fanout"]
    assert fan["actors"] == [1, 4]
    key = "learner_egress_bytes_per_publication"
    for path in ("direct", "relay"):
        for n in ("1", "4"):
            figures = fan[path][n]
            assert figures["publications_missed"] == 0, (path, n)
            assert 0 < figures["latency_ms_median"] <= figures["latency_ms_p90"], (path, n)
            # every publication is the full weights (dense changes), plus a little traffic
            assert fan["weights_bytes"] <= figures[key] < 1.1 * int(n if path == "direct" else 1) * fan["weights_bytes"]
    assert fan["egress_growth_vs_1"]["relay"] < 1.1 and fan["egress_growth_vs_1"]["direct"] > 3.5
    assert fan["egress_goal_met"] is True
