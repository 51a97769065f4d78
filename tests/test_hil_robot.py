"""``examples/hil_robot.py --quick``: every step of the experiment (keys, robot server, recording, the
classifier, four variants through the command line, evaluation) at a tiny size, and its keys."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embodyrl.runlog import has_artifacts, kept_runs

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_quick_experiment_writes_every_key_and_resumes_without_redoing_work(tmp_path):
    command = [sys.executable, str(ROOT / "examples" / "hil_robot.py"), "--out", str(tmp_path / "hil"), "--quick",
               "--port", str(free_port()), "--keep", str(tmp_path / "kept")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "hil" / "results.json").read_text())
    assert set(result["variants"]) == {"scratch", "demos", "demos_interventions", "classifier_reward",
                                       "crossq_demos_interventions"}
    for name, variant in result["variants"].items():
        assert len(variant["steps"]) == len(variant["success_rate"]) == 1 and variant["steps"][0] >= 300
        assert 0.0 <= variant["success_rate"][0] <= 1.0
        assert set(variant["success_rate_by_seed"]) == {"0"}
        assert ("intervention_rate" in variant) == (name in ("demos_interventions", "classifier_reward",
                                                             "crossq_demos_interventions"))
    assert 0.0 < result["variants"]["demos_interventions"]["intervention_rate"][0] <= 1.0  # the person acted
    assert {"precision", "recall"} <= set(result["classifier"]) and result["wall_s"] > 0
    assert result["demonstrations"]["episodes"] == 3 and result["goals"]["complete"]
    for run in ("scratch-s0", "classifier_reward-s0"):  # every run is a real run directory
        assert (tmp_path / "hil" / "runs" / run / "config.json").exists()
    crossq = json.loads((tmp_path / "hil" / "runs" / "crossq_demos_interventions-s0" / "config.json").read_text())
    assert crossq["algorithm"] == "crossq" and crossq["learner"]["mix"] == {"demonstration": 0.5, "online": 0.5}
    assert crossq["crossq"]["discount"] == 0.97 and crossq["crossq"]["critic_hidden_sizes"] == [256, 256]
    robot = json.loads((tmp_path / "hil" / "runs" / "classifier_reward-s0" / "config.json").read_text())["robot"]
    recorded = robot["files"]["push_classifier.yaml"]
    assert recorded["declaration"]["task"]["reward"] == "classifier:classifier" and recorded["classifier"]["sha256"]

    started = time.monotonic()
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert time.monotonic() - started < 120  # nothing trained again: the same command resumes
    assert json.loads((tmp_path / "hil" / "results.json").read_text())["variants"] == result["variants"]

    # another machine: an empty --out goes on from what --keep holds, training nothing again
    kept = tmp_path / "kept"
    assert len(kept_runs(kept / "runs")) == 5 and all(has_artifacts(run) for run in kept_runs(kept / "runs"))
    assert (kept / "classifier" / "metrics.json").exists() and (kept / "progress.json").exists()
    elsewhere = [*command[:3], str(tmp_path / "elsewhere"), *command[4:]]
    started = time.monotonic()
    moved = subprocess.run(elsewhere, capture_output=True, text=True, timeout=300)
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert "restored the progress" in moved.stdout and time.monotonic() - started < 120
    assert not (tmp_path / "elsewhere" / "runs").exists()
    assert json.loads((tmp_path / "elsewhere" / "results.json").read_text())["variants"] == result["variants"]


@pytest.fixture
def hil(monkeypatch):
    """The experiment script as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hil_robot", ROOT / "examples" / "hil_robot.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_resumed_segment_takes_no_second_random_warm_up(tmp_path, hil, monkeypatch):
    calls = []
    monkeypatch.setattr(hil, "cli", lambda *args, **kw: calls.append(args))
    plan = hil.Plan()
    hil.train_to(tmp_path, plan, "demos", 0, 2500)
    (hil.run_dir(tmp_path, "demos", 0)).mkdir(parents=True)
    (hil.run_dir(tmp_path, "demos", 0) / "config.json").write_text("{}")
    hil.train_to(tmp_path, plan, "demos", 0, 5000)
    first, second = calls
    assert "--actor.random_steps" in first and "--resume" not in first
    assert "--actor.random_steps" not in second and "--resume" in second


def test_the_intervention_rate_is_the_segments_episodes_not_the_last_record(hil):
    records = [{"env_steps": 100, "episodes": 4, "intervention_rate": 0.5},
               {"env_steps": 200, "episodes": 6, "intervention_rate": 0.2},
               {"eval_return_mean": 1.0},  # not a training record
               {"env_steps": 300, "episodes": 10, "intervention_rate": 0.1},
               {"env_steps": 400, "episodes": 12, "intervention_rate": None}]
    assert hil.intervention_rate(records, 0) == pytest.approx((4 * 0.5 + 2 * 0.2 + 4 * 0.1) / 10)
    assert hil.intervention_rate(records, 200) == pytest.approx(0.1)  # only episodes after step 200
    assert hil.intervention_rate(records, 300) is None


def test_a_kept_run_without_its_artifacts_starts_again(tmp_path, hil):
    """Points whose metrics are gone could not be checked: restoring drops them, and keeps the rest."""
    kept, out = tmp_path / "kept", tmp_path / "out"
    points = [{"steps": 100, "success_rate": 0.5}]
    (kept / "runs" / "scratch-s0").mkdir(parents=True)
    for name in ("config.json", "summary.json", "metrics.jsonl"):
        (kept / "runs" / "scratch-s0" / name).write_text("{}\n")
    (kept / "progress.json").write_text(json.dumps({"scratch/0": points, "demos/0": points, "_wall_s": 9.0}))
    hil.restore(out, kept)
    assert json.loads((out / "progress.json").read_text()) == {"scratch/0": points, "_wall_s": 9.0}
