"""``embodyrl train`` end to end in a subprocess, on a tiny budget."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import default_sigint, in_process


def _embodyrl(*args):
    return [sys.executable, "-m", "embodyrl.cli", *args]


def _group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def _port_free(endpoint: str) -> bool:
    """Nothing listens on the port (connections in TIME_WAIT may linger, as for any server)."""
    port = int(endpoint.rsplit(":", 1)[1])
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_train_writes_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_embodyrl("train", "pendulum", "--steps", "800", "--learner.min_replay", "100",
                                      "--learner.rate_tolerance", "512", "--actor.random_steps", "100",
                                      "--eval_every", "400", "--run-dir", str(run_dir), "--quiet"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert _group_gone(proc.pid, 10), "a child process outlived the run"
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("env_steps", "wall_s", "eval_return_mean", "eval_upright_fraction", "eval_angle_error_median",
                "random_return_mean"):
        assert key in summary
    assert summary["env_steps"] >= 800
    assert json.loads(out) == summary
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for key in ("time", "env_steps", "episodes", "episode_return", "updates", "policy_version"):
        assert key in lines[-1]
    assert lines[-1]["updates"] > 0 and lines[-1]["policy_version"] > 1
    # the learner trails the ratio by up to rate_tolerance while the actor runs, then trains what is owed
    assert lines[-1]["updates"] >= lines[-1]["replay_size"] - 100 - 16 and lines[-1]["updates_behind"] < 16
    assert any(r["policy_age"] is not None for r in lines) and "policy_age_distribution" in lines[-1]
    assert summary["policy_age"] == lines[-1]["policy_age_distribution"] and summary["policy_age"]["rows"] > 0
    evals = summary["evals"]  # the policy as training reached 400 and 800 steps, evaluated as the final one
    assert [e["env_steps"] for e in evals] == [400, 800]
    assert evals[0]["updates"] < evals[1]["updates"] <= lines[-1]["updates"]  # the final one also has the owed
    assert len((run_dir / "eval.jsonl").read_text().splitlines()) == 2
    assert lines[-1]["episodes"] >= 4  # 800 steps of 200-step episodes
    config = json.loads((run_dir / "config.json").read_text())
    assert config["steps"] == 800 and config["task"] == "pendulum"
    assert (run_dir / "policy" / "weights.npz").exists()
    assert _port_free(json.loads((run_dir / "learner.json").read_text())["endpoint"])


def test_ctrl_c_stops_every_process_and_frees_the_port(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_embodyrl("train", "pendulum", "--steps", "1000000", "--run-dir", str(run_dir)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 120
        metrics = run_dir / "metrics.jsonl"
        while not (metrics.exists() and any(json.loads(line)["updates"] > 0  # training has started
                                            for line in metrics.read_text().split("\n")[:-1])):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert "env steps" in err and "policy lag" in err  # stderr is a pipe: plain progress lines
    assert "\x1b[" not in err  # no terminal control codes in a log
    assert _group_gone(proc.pid, 10), "a child process outlived Ctrl-C"
    assert _port_free(json.loads((run_dir / "learner.json").read_text())["endpoint"])
    assert (run_dir / "policy" / "weights.npz").exists(), "the learner saves its weights on the way out"


def test_unknown_task_is_a_clear_error():
    out = in_process("train", "cartwheel")
    assert out.returncode == 2
    assert "unknown task 'cartwheel'" in out.stderr


@pytest.mark.slow
def test_default_pendulum_run_holds_the_pole_upright(tmp_path):
    """The default budget within 15 minutes: upright >= 80 % and the pole near the top (median angle
    under 0.1 rad; every seed of the benchmarks page's 10-seed table is under 0.08, 7 of 10 under 0.05)."""
    run_dir = tmp_path / "run"
    out = subprocess.run(_embodyrl("train", "pendulum", "--run-dir", str(run_dir), "--quiet"),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    summary = json.loads(Path(run_dir / "summary.json").read_text())
    assert summary["wall_s"] < 900
    assert summary["eval_upright_fraction"] >= 0.8
    assert summary["eval_angle_error_median"] < 0.1
    assert summary["random_upright_fraction"] < 0.2


def test_resume_continues_a_run_and_a_used_directory_needs_it(tmp_path):
    run_dir = tmp_path / "run"
    small = ("--ddpg.hidden_sizes", "[32, 32]", "--sac.hidden_sizes", "[32, 32]", "--learner.min_replay", "200",
             "--eval_episodes", "1", "--quiet")
    first = subprocess.run(_embodyrl("train", "pendulum", "--steps", "500", "--run-dir", str(run_dir), *small,
                                     "--actor.random_steps", "300"),
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    updates_before = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["updates"]
    warmup_rows = _unversioned_rows(run_dir)
    assert warmup_rows > 0  # the first run's random warm-up
    again = in_process("train", "pendulum", "--steps", "500", "--run-dir", str(run_dir))
    assert again.returncode == 2 and "--resume" in again.stderr
    resumed = subprocess.run(_embodyrl("train", "pendulum", "--steps", "1000", "--run-dir", str(run_dir),
                                       "--resume", *small), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["env_steps"] >= 1000
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["updates"] > updates_before
    assert last["replay_size"] >= 1000  # the first run's rows are still there
    # no second warm-up (it would add actor.random_steps = 300 rows); a few steps act before the
    # resumed learner's first weights arrive, with the actor's initial network
    assert _unversioned_rows(run_dir) - warmup_rows < 100


def _unversioned_rows(run_dir) -> int:
    """Rows acted before any learner weights (the random warm-up), from `embodyrl replay --json`."""
    report = in_process("replay", run_dir, "--json")
    versions = json.loads(report.stdout)["rows_by_policy_version"]
    return sum(n for version, n in versions.items() if version.startswith("0:"))


def test_the_children_come_from_a_fork_server_and_are_spawned_where_there_is_none(monkeypatch):
    from embodyrl.cli import launch

    with launch.children() as ctx:
        assert ctx.get_start_method() == "forkserver"
    monkeypatch.setattr(launch.mp, "get_all_start_methods", lambda: ["spawn"])  # as on Windows
    with launch.children() as ctx:
        assert ctx.get_start_method() == "spawn"
