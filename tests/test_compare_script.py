"""examples/compare_sbx.py without SBX or hours of training: its embodyrl commands are ones the CLI
takes, its plan interleaves the sides seed by seed, and its report computes what the docs quote
from the runs' summaries (intervals, ratios, the verdict) and keeps every run's artifacts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare_sbx", ROOT / "examples" / "compare_sbx.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare_sbx"] = module
    spec.loader.exec_module(module)
    return module


def test_every_embodyrl_command_of_the_plans_parses_and_validates(compare, tmp_path):
    from embodyrl.cli.commands import build_parser, train_config

    distinct = {}
    for run in compare.plan("all"):
        if run.side != "sbx":
            distinct.setdefault((run.side, run.algorithm, run.env), run)
    assert {side for side, _, _ in distinct} >= {"embodyrl", "sync",
                                                  *(f"embodyrl:{v}" for v in (*compare.VARIANTS, *compare.OPTIONS))}
    for run in distinct.values():
        command = compare.embodyrl_command(run, tmp_path / run.name)
        assert command[1:4] == ["-m", "embodyrl.cli", "train"]
        args, args.overrides = build_parser().parse_known_args(command[3:])
        config = train_config(args, None)  # as embodyrl train resolves it; a refused --synchronous raises
        assert config.algorithm == run.algorithm
        assert (config.steps, config.seed, config.eval_every, config.eval_episodes) == (run.steps, run.seed, 5000, 5)
        algo = config.algo.config
        assert (algo.hidden_sizes, algo.batch_size, algo.actor_lr, algo.critic_lr) == ((256, 256), 256, 3e-4, 3e-4)
        assert config.actor.random_steps == config.learner.min_replay == 10_000
        assert config.synchronous == (run.side == "sync")
        if run.side == "embodyrl:clip":  # SBX's log-std bound
            assert (algo.log_std_bounds, algo.log_std_min) == ("clip", -20.0)


def test_the_plan_interleaves_sides_and_runs_the_first_seeds_to_100k(compare):
    parity = compare.plan("parity")
    cheetah = [r for r in parity if r.env == "HalfCheetah-v5"]
    assert [r.side for r in cheetah[:4]] == ["sbx", "embodyrl", "sbx", "embodyrl"]
    assert {(r.seed, r.steps) for r in cheetah} == {(s, 100_000 if s < 3 else 50_000) for s in range(5)}
    assert len({r.name for r in compare.plan("all")}) == len(compare.plan("all"))  # no run twice


def _fake_run(root: Path, name: str, curve: dict[int, float], wall_s: float):
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text(json.dumps({"env_steps": max(curve), "episode_return": 0.0}) + "\n")
    (run / "summary.json").write_text(json.dumps({
        "wall_s": wall_s, "cpu_s": 2 * wall_s, "evals": [{"env_steps": k, "return_mean": v} for k, v in curve.items()]}))


def test_the_report_gives_intervals_ratios_and_keeps_every_run(compare, tmp_path):
    root, out = tmp_path / "runs", tmp_path / "report"
    sbx = [3000.0, 2000.0, 2500.0, 3500.0, 2600.0]
    ours = [2900.0, 2200.0, 2400.0, 3300.0, 2700.0]
    for seed in range(5):
        steps = 100_000 if seed < 3 else 50_000
        for side, values in (("sbx", sbx), ("embodyrl", ours)):
            curve = {m: values[seed] * m / 50_000 for m in range(5_000, steps + 1, 5_000)}
            _fake_run(root, compare.Run(side, "td3", "HalfCheetah-v5", seed, steps).name, curve, 100.0 + seed)
    result = compare.report(root, out, "parity")
    at_50k, at_100k = result["rows"]
    assert at_50k["steps"] == 50_000 and at_50k["sbx"]["returns"] == sbx and at_50k["embodyrl"]["returns"] == ours
    low, high = compare.bootstrap_interval(sbx)
    assert at_50k["sbx"]["interval"] == [round(low, 1), round(high, 1)] and low < np.mean(sbx) < high
    assert at_50k["ratio"] == round(np.mean(ours) / np.mean(sbx), 3) and at_50k["within_or_above_sbx_interval"]
    assert at_50k["sbx"]["wall_s"] == 103.5  # the runs that ended at 50k: seeds 3 and 4
    assert at_100k["embodyrl"]["returns"] == [2 * v for v in ours[:3]] and at_100k["published"] == 5514
    table = (out / "table.md").read_text()
    assert "| HalfCheetah-v5 | td3 | 50,000 |" in table
    assert "| SBX wall s | SBX CPU s | embodyrl wall s |" in table  # what a run cost each side
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert len(list((out / "runs").glob("*/summary.json"))) == 10


def test_the_path_table_gives_each_part_its_gap_to_the_synchronous_loop(compare):
    def runs(side, values, steps, age):
        return [(compare.Run(side, "sac", "HalfCheetah-v5", seed, steps),
                 {"evals": [{"env_steps": 50_000, "return_mean": v}], "wall_s": 300.0, "cpu_s": 500.0,
                  "policy_age": {"rows": 40_000, "mean": age}}) for seed, v in enumerate(values)]

    table = compare.path_table({"sync": runs("sync", [3000, 3200, 3400], 50_000, 0.0),
                                # seeds 3 and 4 have no synchronous run to stand beside: left out
                                "embodyrl": runs("embodyrl", [2800, 3000, 3200, 9000, 9000], 100_000, 120.0),
                                "embodyrl:weights": runs("embodyrl:weights", [3100, 3200, 3300], 50_000, 40.0),
                                # a part with 2 seeds done is measured against the same 2 seeds
                                "embodyrl:calls": runs("embodyrl:calls", [2900, 3300], 50_000, 1.0)})
    rows = table.splitlines()[2:]
    assert rows[0].startswith("| sync | 3,200 [") and "| +0 | 0 | 300 | 500 |" in rows[0]
    assert rows[1].startswith("| embodyrl | 3,000 [") and "| -200 | 120 | (100k runs) |" in rows[1]
    assert "(s0 2,800, s1 3,000, s2 3,200)" in rows[1]
    assert rows[2].startswith("| embodyrl:weights | 3,200 [") and "| +0 | 40 |" in rows[2]
    assert rows[3].startswith("| embodyrl:calls | 3,100 [") and "| +0 | 1 |" in rows[3]
    assert compare.path_table({"embodyrl": runs("embodyrl", [1], 50_000, 1.0)}) == ""  # nothing to measure against


def test_lanes_share_a_plan_a_live_lanes_claim_is_skipped_a_dead_ones_taken_over(compare, tmp_path):
    run = compare.Run("sbx", "td3", "HalfCheetah-v5", 3, 50_000)
    claim = tmp_path / f"{run.name}.claim"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        claim.write_text(str(live.pid))
        assert compare._claim(run, tmp_path) is None  # another lane is on it
        live.kill()
    live.wait()
    assert compare._claim(run, tmp_path) == claim and claim.read_text() == str(os.getpid())
    assert compare._claim(run, tmp_path) is None  # now this lane's claim stands against the others


def test_only_and_sides_pick_the_runs_a_lane_takes(compare, monkeypatch, tmp_path):
    taken = []
    monkeypatch.setattr(compare, "run_one", lambda run, root: taken.append(run.name))
    compare.main(["run", "--plan", "parity", "--sides", "sbx,embodyrl", "--only", "*-HalfCheetah-v5-s3",
                  "--root", str(tmp_path)])
    assert taken == ["sbx-td3-HalfCheetah-v5-s3", "embodyrl-td3-HalfCheetah-v5-s3",
                     "sbx-sac-HalfCheetah-v5-s3", "embodyrl-sac-HalfCheetah-v5-s3"]


@pytest.mark.parametrize("which, width, count, steps", [("crossq", 2048, 20, 100_000), ("crossq-cpu", 256, 12, 50_000)])
def test_the_crossq_plans_run_the_papers_settings_on_both_sides(compare, tmp_path, which, width, count, steps):
    from embodyrl.cli.commands import build_parser, train_config

    runs = [r for r in compare.plan(which) if r.algorithm != "sac"]  # crossq-cpu ends with SAC's parity runs
    assert len(runs) == count and {r.steps for r in runs} == {steps}
    assert [r.side for r in runs[:4]] == ["sbx", "embodyrl", "sbx", "embodyrl"]
    assert compare.crossq_settings(runs[1].algorithm)["critic_hidden_sizes"] == [width, width]
    command = compare.embodyrl_command(runs[1], tmp_path / runs[1].name)
    args, args.overrides = build_parser().parse_known_args(command[3:])
    config = train_config(args, None)
    algo = config.algo.config
    assert config.algorithm == "crossq"
    assert (algo.hidden_sizes, algo.critic_hidden_sizes, algo.batch_size) == ((256, 256), (width, width), 256)
    assert (algo.actor_lr, algo.critic_lr, algo.temperature_lr, algo.adam_b1, algo.policy_delay) == (1e-3, 1e-3, 1e-3,
                                                                                                      0.5, 3)
    assert config.actor.random_steps == config.learner.min_replay == 5_000


def test_a_cut_off_run_goes_on_from_its_checkpoint_and_one_without_starts_again(compare, tmp_path, monkeypatch):
    commands = []

    def finish(command, **_):  # what a run leaves when it ends, without training
        commands.append(command)
        out = Path(command[command.index("--run-dir") + 1] if "--run-dir" in command else command[-1])
        (out / "eval.jsonl").write_text(json.dumps({"env_steps": 50_000, "return_mean": 1.0}) + "\n")
        (out / "summary.json").write_text("{}")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(compare.subprocess, "run", finish)
    ours, sync, sbx = (compare.Run(side, "sac", "HalfCheetah-v5", 0, 50_000) for side in ("embodyrl", "sync", "sbx"))
    for run in (ours, sync, sbx):  # cut off after a checkpoint
        out = tmp_path / run.name
        (out / "checkpoints" / "7").mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / compare.SBX_CHECKPOINT).mkdir()
        (out / compare.SBX_CHECKPOINT / "resume.json").write_text(json.dumps({"env_steps": 10_000, "time": 1.0}))
        (out / "stale").write_text("from the run cut off")
    assert [compare.resumable(run, tmp_path / run.name) for run in (ours, sync, sbx)] == [True, False, True]
    for run in (ours, sync, sbx):
        compare.run_one(run, tmp_path)
    assert commands[0][-1] == "--resume" and "--resume" not in commands[1]
    assert commands[2][2:4] == ["_sbx", "sac"]  # the SBX side finds its checkpoint itself
    assert (tmp_path / ours.name / "stale").exists() and (tmp_path / sbx.name / "stale").exists()
    assert not (tmp_path / sync.name / "stale").exists()  # started again
    starts = [json.loads((tmp_path / run.name / "summary.json").read_text())["starts"] for run in (ours, sync, sbx)]
    assert starts == [2, 1, 2]
    # a run cut off before any checkpoint starts again, whatever its side
    fresh = compare.Run("embodyrl", "sac", "HalfCheetah-v5", 1, 50_000)
    (tmp_path / fresh.name).mkdir()
    (tmp_path / fresh.name / "stale").write_text("no checkpoint yet")
    compare.run_one(fresh, tmp_path)
    assert "--resume" not in commands[-1] and not (tmp_path / fresh.name / "stale").exists()
