"""The NWP experiment's rank program on a tiny grid with 2 real MPI ranks, and the whole example (slow)."""

import json
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from embodyrl.coupling.nwp import ExperimentConfig
from embodyrl.envs.columns import row_split
from embodyrl.hal.steps import PolicyVersion
from tests.test_coupling_mpi import MPIEXEC, LearnerThread, level_policy

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")

TINY = ExperimentConfig(nlat=6, nlon=8, spin_up_days=0.5, train_starts_days=(0.0,), train_days=0.25,
                        eval_starts_days=(0.5,), lead_hours=(3, 6), free_run_days=0.25, stream_fraction=0.5,
                        stream_every=2, send_every=2, policy_wait_s=30.0)


def test_tiny_run_on_two_ranks_streams_from_both_and_scores_three_forecasts(tmp_path):
    coupling = TINY.coupling()
    level_policy(tmp_path, PolicyVersion(7, 0), cfg=coupling, name="policy_init")
    level_policy(tmp_path, PolicyVersion(7, 9), seed=1, cfg=coupling, name="policy")  # the "frozen" policy
    learner = LearnerThread()
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"experiment": asdict(TINY), "out": str(tmp_path), "learner": learner.endpoint}))
    try:
        rank = Path(__file__).resolve().parents[1] / "examples" / "nwp_column_correction.py"
        proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(rank), "rank", str(args)],
                              capture_output=True, text=True, timeout=240)
        time.sleep(0.2)
    finally:
        learner.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    train_steps = int(TINY.train_days * 48)
    blocks = row_split(TINY.nlat, 2)
    for r, rows in enumerate(blocks):  # every rank streamed its own half of its columns, every 2nd step
        assert learner.rows[(r, r)] == (train_steps // 2) * round(0.5 * len(rows) * TINY.nlon)
    assert (tmp_path / "training_done").exists()
    sums = np.load(tmp_path / "band_error_sums.npy")
    assert sums.shape == (3, 2, 2, 6) and np.isfinite(sums).all() and (sums > 0).all()
    assert not np.allclose(sums[0], sums[1]) and not np.allclose(sums[0], sums[2])  # the corrections acted
    assert (sums[:, 1] > sums[:, 0]).mean() > 0.5  # errors grow with lead time
    reports = json.loads((tmp_path / "ranks.json").read_text())
    assert [r["columns"] for r in reports] == [len(rows) * TINY.nlon for rows in blocks]
    for r in reports:
        assert r["stability"]["finite"] and r["stability"]["largest_correction"] <= TINY.max_correction + 1e-5
        assert r["train_link"]["zero_answers"] == 0 and r["train_link"]["link_s"] > 0
    analysis = np.load(tmp_path / "analysis.npy", mmap_mode="r")
    assert np.isfinite(analysis).all() and (analysis[-1] > 150).all()  # every rank wrote its columns
    np.testing.assert_allclose(sums[0], _serial_native_sums(analysis), rtol=1e-9)  # counted once, all ranks


def _serial_native_sums(analysis):
    """The native forecast's band sums of |error|, recomputed on the whole grid in one process."""
    from embodyrl.envs.columns import DAY_S, ColumnConfig, ColumnModel

    model = ColumnModel(ColumnConfig.model(nlat=TINY.nlat, nlon=TINY.nlon), seed=500)
    dt = model.cfg.dt_s
    k0 = int(round(TINY.eval_starts_days[0] * DAY_S / dt))
    model.time_s = TINY.spin_up_days * DAY_S + k0 * dt
    theta = analysis[k0 // TINY.analysis_every].astype(np.float64)
    leads = [int(h * 3600 / dt) for h in TINY.lead_hours]
    out = np.zeros((len(leads), 2, 6))
    for k in range(1, max(leads) + 1):
        theta, _ = model.step(theta)
        if k in leads:
            s, frac = divmod(k0 + k, TINY.analysis_every)
            ref = analysis[s].astype(np.float64)
            if frac:
                ref = ref + (analysis[s + 1] - ref) * frac / TINY.analysis_every
            for j, field in enumerate((model.grid.z500, model.grid.t850)):
                out[leads.index(k), j] = model.band_sums(np.abs(field(theta) - field(ref)))[0]
    return out


@pytest.mark.slow
def test_the_example_runs_end_to_end_and_writes_the_named_keys(tmp_path):
    script = Path(__file__).parent.parent / "examples" / "nwp_column_correction.py"
    proc = subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--quick", "--ranks", "2"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    keys = {"band", "native_mae_z500", "bias_corrected_mae_z500", "corrected_mae_z500", "native_mae_t850",
            "corrected_mae_t850"}
    assert len(res["bands"]) == 6 and all(keys <= set(b) for b in res["bands"])
    assert all(np.isfinite(b[k]) for b in res["bands"] for k in keys - {"band"})
    assert res["lead_hours"] == list(ExperimentConfig.quick().lead_hours)
    assert [d["lead_hours"] for d in res["by_lead"]] == res["lead_hours"]
    assert isinstance(res["stable"], bool)
    assert 0 < res["link_overhead_fraction"] < 10 and res["inference_fraction"] > 0
    assert sum(res["learner"]["steps_by_rank"].values()) > 0 and set(res["learner"]["steps_by_rank"]) == {"0", "1"}
    assert (tmp_path / "nwp_column_correction.png").stat().st_size > 10_000


def test_quick_config_fits_its_grid():
    quick = ExperimentConfig.quick()
    assert quick.period_days >= max(quick.eval_starts_days) + max(quick.lead_hours) / 24
    assert replace(quick, nlat=8).coupling().levels == 70
