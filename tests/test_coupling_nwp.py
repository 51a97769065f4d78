"""The NWP experiment's rank program on a tiny grid with 2 real MPI ranks, and the whole example (slow)."""

import json
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from embodyrl.coupling.nwp import BAND_NAMES, SEEDED, VARIANTS, ExperimentConfig
from embodyrl.coupling.testing import ServedCoupling, random_export
from embodyrl.envs.columns import row_split
from embodyrl.hal.steps import PolicyVersion
from tests.test_coupling_mpi import MPIEXEC

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")

TINY = ExperimentConfig(nlat=6, nlon=8, spin_up_days=0.5, train_starts_days=(0.0,), train_days=0.25,
                        free_starts_days=(0.0,), free_days=0.25, free_window=4, eval_starts_days=(0.5,),
                        lead_hours=(3, 6), seeds=1, free_run_days=0.25, stream_fraction=0.5, stream_every=2,
                        send_every=2, policy_wait_s=30.0)


def test_tiny_run_on_two_ranks_streams_both_trainings_and_scores_every_forecast_system(tmp_path):
    # as the example's learner process does: one coupling learner per trained member, each writing its
    # own export as the policy its ranks start from (its server admits rows acted under no other)
    learners = {member: ServedCoupling(TINY.coupling(free=member.startswith("rl_free")))
                for member in ("rl_nudged/s0", "rl_free/s0")}
    try:
        for member, learner in learners.items():
            learner.export(tmp_path / f"policy_init_{member.replace('/', '-')}")
        coupling = TINY.coupling()
        for i, member in enumerate(m for m in TINY.members() if m not in ("native", "bias_corrected")):
            random_export(tmp_path, PolicyVersion(7, 9), seed=1 + i, cfg=coupling,
                          name=f"policy_{member.replace('/', '-')}")
        args = tmp_path / "args.json"
        args.write_text(json.dumps({"experiment": asdict(TINY), "out": str(tmp_path),
                                    "learners": {m: learner.endpoint for m, learner in learners.items()}}))
        rank = Path(__file__).resolve().parents[1] / "examples" / "nwp_column_correction.py"
        proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(rank), "rank", str(args)],
                              capture_output=True, text=True, timeout=240)
        time.sleep(0.2)
    finally:
        for learner in learners.values():
            learner.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = int(TINY.train_days * 48)
    blocks = row_split(TINY.nlat, 2)
    for r, rows in enumerate(blocks):  # every rank streamed its own half of its columns, every 2nd step
        per_step = round(0.5 * len(rows) * TINY.nlon)
        assert learners["rl_nudged/s0"].rows()[(r, r)] == (steps // 2) * per_step
        # free forecasts: every column once per window of 4 steps, 3 windows in the 12 steps
        assert learners["rl_free/s0"].rows()[(r, r)] == 3 * len(rows) * TINY.nlon
        recorded = np.load(tmp_path / "increments" / f"rank{r}.npz")
        assert recorded["increment"].shape == ((steps // 2) * per_step, 70) and np.isfinite(recorded["increment"]).all()
    free_rewards = np.concatenate([t.steps.reward for t in learners["rl_free/s0"].taken])
    assert (free_rewards < 0).all() and np.isfinite(free_rewards).all()  # minus squared errors
    for name in ("analysis_done", "train_done", "free-s0_done"):
        assert (tmp_path / name).exists()
    sums = np.load(tmp_path / "forecast_sums.npz")
    assert list(sums["members"]) == TINY.members()
    errors = sums["abs"]
    assert errors.shape == (len(TINY.members()), 1, 2, 2, 6) and np.isfinite(errors).all() and (errors > 0).all()
    assert len({round(float(e.sum()), 6) for e in errors}) == len(errors)  # every correction acted differently
    assert (errors[:, :, 1] > errors[:, :, 0]).mean() > 0.5  # errors grow with lead time
    assert sums["signed"].shape == (len(TINY.members()), 1, 2, 2) and (sums["unbounded"] == 0).all()
    reports = json.loads((tmp_path / "ranks.json").read_text())
    assert [r["columns"] for r in reports] == [len(rows) * TINY.nlon for rows in blocks]
    for r in reports:
        assert r["stability"]["finite"] and r["stability"]["largest_correction"] <= TINY.max_correction + 1e-5
        assert r["train_link"]["zero_answers"] == 0 and r["train_link"]["link_s"] > 0
        assert r["free-s0_link"]["zero_answers"] == 0
    analysis = np.load(tmp_path / "analysis.npy", mmap_mode="r")
    assert np.isfinite(analysis).all() and (analysis[-1] > 150).all()  # every rank wrote its columns
    np.testing.assert_allclose(errors[0, 0], _serial_native_sums(analysis), rtol=1e-9)  # counted once, all ranks


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


def learning_curve(run_dir: Path, member: str) -> list[dict]:
    """A learner's metrics records, checked to be one training's (updates never going back)."""
    records = [json.loads(line) for line in (run_dir / "metrics" / member.replace("/", "-") / "metrics.jsonl")
               .read_text().splitlines()]
    updates = [r["updates"] for r in records]
    assert len(records) >= 2 and updates == sorted(updates), updates
    return records


def test_the_example_at_reduced_size_writes_every_key(tmp_path):
    script = Path(__file__).parent.parent / "examples" / "nwp_column_correction.py"
    command = [sys.executable, str(script), "--out", str(tmp_path), "--quick", "--ranks", "2", "--keep-analysis"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "goal_met=" in proc.stdout
    quick = ExperimentConfig.quick()
    res = json.loads((tmp_path / "results.json").read_text())
    keys = {"band", "native_mae_z500", "bias_corrected_mae_z500", "corrected_mae_z500", "native_mae_t850",
            "corrected_mae_t850"}
    assert len(res["bands"]) == 6 and all(keys <= set(b) for b in res["bands"])
    assert all(np.isfinite(b[k]) for b in res["bands"] for k in keys - {"band"})
    assert res["lead_hours"] == list(quick.lead_hours)
    assert [d["lead_hours"] for d in res["by_lead"]] == res["lead_hours"]
    assert set(res["by_variant"]) == set(VARIANTS)
    for variant, entry in res["by_variant"].items():
        assert entry["seeds"] == (quick.seeds if variant in SEEDED else 1) and entry["bounded_fraction"] == 1.0
        assert [d["lead_hours"] for d in entry["by_lead"]] == res["lead_hours"]
        for d in entry["by_lead"]:
            for field in ("z500", "t850"):
                value = d["area_weighted"][field]
                assert value["ci95"][0] <= value["mean"] <= value["ci95"][1] and len(value["by_seed"]) == entry["seeds"]
                assert np.isfinite(d["drift"][field])
            assert [b["band"] for b in d["bands"]] == BAND_NAMES and all(b["mae_z500"] > 0 for b in d["bands"])
    goal = res["goals"]["beats_offline_fits_by_20_percent"]
    assert goal["best_learnt_variant"] in SEEDED and isinstance(goal["met"], bool)
    assert len(goal["by_variant"]["rl_free"]["checks"]) == 2 * 2 * 3  # 2 leads x 2 fields x 3 baselines
    consequences = res["goals"]["consequences_beat_every_offline_fit"]
    assert len(consequences["checks"]) == 2 * 2 * 4 and isinstance(consequences["met"], bool)
    gap = res["baselines"]["gap"]
    assert gap["needed"] == 1.3 and gap["best_fit"] in ("ridge", "polynomial") and isinstance(gap["met"], bool)
    assert gap["best_fit_r2"] == max(res["baselines"]["ridge_r2_heldout"], res["baselines"]["polynomial_r2_heldout"])
    assert isinstance(res["stable"], bool) and res["goals"]["all_forecasts_bounded"] is True
    assert 0 < res["baselines"]["ridge_r2_heldout"] < 1 and res["baselines"]["mlp_r2_heldout"] < 1
    climate = res["climate"]
    assert climate["days"] == quick.climate_days and set(climate["by_member"]) == {
        "native", "bias_corrected", "ridge", "polynomial", "mlp/s0", "rl_nudged/s0", "rl_free/s0"}
    for entry in climate["by_member"].values():
        assert entry["bounded"] and len(entry["bands"]) == 6 and 0 <= entry["hellinger_mean"] <= 1
        for b in entry["bands"]:
            assert b["mean_error_ci95"][0] <= b["mean_error"] <= b["mean_error_ci95"][1]
            assert abs(b["mean"] - b["truth_mean"] - b["mean_error"]) < 1e-9 and b["std"] >= 0
    np.testing.assert_allclose(np.sum(climate["truth_hist"], axis=-1), 1.0)
    assert (tmp_path / "nwp_climate.png").stat().st_size > 10_000
    cost = res["us_per_column_step"]
    assert all(cost[k] > 0 for k in ("physics", "link", "inference")) and "MLP" in cost["inference_network"]
    assert 0 < res["link_overhead_fraction"] < 10 and res["inference_fraction"] > 0
    for member in ("rl_nudged/s0", "rl_free/s1"):
        learner = res["learners"][member]
        assert learner["updates"] >= 200 and set(learner["steps_by_rank"]) == {"0", "1"}
        curve = learning_curve(tmp_path, member)  # each learner's metrics.jsonl, as every learner writes
        assert curve[-1]["updates"] == learner["updates"] and np.isfinite(curve[-1]["critic_loss"])
    assert (tmp_path / "nwp_column_correction.png").stat().st_size > 10_000

    # the same command resumes: a run that lost one seed's free-forecast policy trains that seed again,
    # forecasts with it, and reads every other phase and forecast back
    (tmp_path / "policy_rl_free-s1.npz").unlink()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'plan: {"analysis": false, "nudged": false, "free_seeds": [1], "baselines": false}' in proc.stdout
    again = json.loads((tmp_path / "results.json").read_text())
    for variant in ("native", "bias_corrected", "ridge", "polynomial", "mlp", "rl_nudged"):
        assert again["by_variant"][variant] == res["by_variant"][variant]
    assert again["learners"]["rl_nudged/s0"] == res["learners"]["rl_nudged/s0"]
    assert again["learners"]["rl_free/s1"]["updates"] >= 200
    assert again["learners"]["rl_free/s1"]["wall_s"] != res["learners"]["rl_free/s1"]["wall_s"]
    assert learning_curve(tmp_path, "rl_free/s1")[-1]["updates"] == again["learners"]["rl_free/s1"]["updates"]
    assert again["us_per_column_step"] == res["us_per_column_step"]  # the nudged phase's, from its saved report

    # another configuration in the same directory is refused, and the run's files stay
    proc = subprocess.run([*command[:-2], "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "another configuration" in proc.stderr and "--fresh" in proc.stderr
    assert json.loads((tmp_path / "results.json").read_text()) == again


def test_quick_config_fits_its_grid():
    quick = ExperimentConfig.quick()
    assert quick.period_days >= max(quick.eval_starts_days) + max(quick.lead_hours) / 24
    assert replace(quick, nlat=8).coupling().levels == 70


def _variant(values: dict[int, tuple[float, float, float]], leads=(24, 72)) -> dict:
    """A by_variant entry whose area-weighted Z500 and T850 at each lead are (mean, lo, hi)."""
    return {"bounded_fraction": 1.0, "by_lead": [
        {"lead_hours": h, "area_weighted": {f: {"mean": values[h][0], "ci95": [values[h][1], values[h][2]]}
                                            for f in ("z500", "t850")}} for h in leads]}


def test_the_goal_needs_twenty_percent_and_separate_intervals_against_both_baselines_at_both_leads():
    from embodyrl.coupling.nwp import goals

    exp = replace(ExperimentConfig(), lead_hours=(24, 72))
    base = {"bias_corrected": _variant({24: (1.0, 0.9, 1.1), 72: (3.0, 2.8, 3.2)}),
            "ridge": _variant({24: (1.1, 1.0, 1.2), 72: (3.0, 2.9, 3.1)})}
    good = _variant({24: (0.7, 0.65, 0.75), 72: (2.0, 1.9, 2.1)})  # 30 % and 33 % below, intervals apart
    overlapping = _variant({24: (0.7, 0.6, 0.95), 72: (2.0, 1.9, 2.1)})  # 30 % below but overlaps bias at +24 h
    small = _variant({24: (0.85, 0.8, 0.88), 72: (2.5, 2.4, 2.6)})  # apart but only 15 % below at +24 h
    result = goals({**base, "mlp": small, "rl_nudged": overlapping, "rl_free": good}, exp)
    goal = result["beats_offline_fits_by_20_percent"]
    assert goal["met"] and goal["best_learnt_variant"] == "rl_free"
    assert not goal["by_variant"]["rl_nudged"]["met"] and not goal["by_variant"]["mlp"]["met"]
    assert abs(goal["by_variant"]["mlp"]["worst_reduction"] - 0.15) < 1e-9
    assert result["all_forecasts_bounded"]
    assert result["consequences_beat_every_offline_fit"]["met"]  # below bias, ridge and the MLP, apart
    assert not goals({**base, "mlp": good, "rl_free": good}, exp)["consequences_beat_every_offline_fit"]["met"]
    result = goals({**base, "mlp": small, "rl_nudged": overlapping}, exp)
    assert not result["beats_offline_fits_by_20_percent"]["met"]
    unbounded = {**base, "rl_free": {**good, "bounded_fraction": 0.75}}
    assert not goals(unbounded, exp)["all_forecasts_bounded"]


def test_climate_statistics_see_a_shifted_climate_and_call_a_climate_its_own_equal():
    from embodyrl.coupling.nwp import climate_statistics

    rng = np.random.default_rng(0)
    truth = 280 + np.cumsum(rng.normal(size=(240, 6)), axis=0) * 0.1  # 30 days of 3-hourly band means
    bins = np.arange(250.0, 311.0)
    hist = np.stack([np.histogram(truth[:, b], bins)[0] for b in range(6)]).astype(float)
    same = climate_statistics(truth, hist, truth, hist, samples_per_day=8)
    assert same["hellinger_mean"] < 1e-6 and all(b["mean_error"] == 0 for b in same["bands"])
    shifted = truth + 3.0
    far = np.stack([np.histogram(shifted[:, b], bins)[0] for b in range(6)]).astype(float)
    stats = climate_statistics(shifted, far, truth, hist, samples_per_day=8)
    for b in stats["bands"]:
        assert abs(b["mean_error"] - 3.0) < 1e-9 and b["mean_error_ci95"][0] <= 3.0 <= b["mean_error_ci95"][1]
        assert abs(b["autocorrelation_1day"] - b["truth_autocorrelation_1day"]) < 1e-9  # a shift keeps it
    assert stats["hellinger_mean"] > 0.5


def test_the_moist_testbed_plumbs_its_truth_model_and_inputs_through_the_experiment():
    from embodyrl.coupling.nwp import QUICK
    from embodyrl.envs.columns import ColumnConfig

    moist = ExperimentConfig.moist(**QUICK)
    truth, model = moist.configs()
    assert truth.moist_convection and not model.moist_convection
    assert truth == ColumnConfig(**{**vars(model), "moist_convection": True})  # the process, and nothing else
    assert (truth.nlat, truth.nlon) == (QUICK["nlat"], QUICK["nlon"])
    coupling = moist.coupling(free=True)
    assert coupling.context == model.context_size == 7 and coupling.max_correction == 10.0
    assert moist.nudge_tau_h == 1.0 and coupling.reward_horizon == 0 and coupling.stream_every == 1
    assert ExperimentConfig.quick().coupling().context == 6  # the mistuned testbed's inputs are unchanged
    with pytest.raises(ValueError, match="testbed 'wet' is not one of"):
        ExperimentConfig(testbed="wet")


class _RecordingLink:
    """A link that answers one constant correction and keeps each window's target."""

    def __init__(self, answer: float):
        self.answer, self.targets = answer, []

    def exchange(self, state, info):
        if "target" in info:
            self.targets.append(info["target"])
        return np.full(state.shape[:2], self.answer)


def test_a_free_windows_target_is_the_tendency_its_forecast_lacked_whatever_the_policy_answered(tmp_path):
    """An analysis made by the model itself plus 2 K/day everywhere: every window's target is those
    2 K/day, whether the policy corrected by nothing or by too much (5 K/day); on top of an offset
    of 1.5 K/day, it is the 0.5 K/day the offset lacks, whatever the policy adds (to 5 K/day)."""
    from mpi4py import MPI

    from embodyrl.coupling.nwp import Analysis, Rank, train_free
    from embodyrl.envs.columns import DAY_S

    exp = replace(TINY, free_starts_days=(0.0,), free_days=0.5, free_window=6)
    rank = Rank(exp, MPI.COMM_SELF)
    missing = 2.0  # K/day
    model = rank.model(rank.model_cfg, seed=300)  # train_free's first forecast's weather
    model.time_s = exp.spin_up_days * DAY_S
    theta = model.equilibrium(model.time_s)
    snapshots = [theta]
    for k in range(1, int(exp.free_days * 48) + 1):
        theta, _ = model.step(theta, correction=np.full_like(theta, missing / DAY_S))
        if k % exp.analysis_every == 0:
            snapshots.append(theta)
    np.save(tmp_path / "analysis.npy", np.array(snapshots, np.float32))
    analysis = Analysis(rank, tmp_path / "analysis.npy")
    for answer, offset in ((0.0, 0.0), (5.0, 0.0), (0.0, 1.5), (3.5, 1.5)):
        link = _RecordingLink(answer)
        train_free(rank, analysis, link, offset=np.full_like(theta, offset))
        assert len(link.targets) == 4  # windows of 3 h in 12 h
        for target in link.targets:
            off = np.abs(target - (missing - offset))  # not 0: the error built up changes the model's own tendencies
            assert off.mean() < 0.03 * missing and off.max() < 0.1 * missing
