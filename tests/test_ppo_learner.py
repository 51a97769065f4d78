"""``embodyrl train pendulum --algorithm ppo`` end to end: real processes, real sockets, a tiny budget."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.cli_helpers import in_process

TINY = ["--ppo.rollout_length", "32", "--ppo.rollouts_per_iteration", "4", "--ppo.epochs", "2",
        "--ppo.minibatches", "4", "--ppo.hidden_sizes", "[16]", "--actor.send_every", "16",
        "--learner.credit_quantum", "32", "--learner.log_every_s", "0.2", "--eval_episodes", "2"]


def _train(run_dir, steps, *extra):
    cmd = [sys.executable, "-m", "embodyrl.cli", "train", "pendulum", "--algorithm", "ppo", "--actors", "2",
           "--steps", str(steps), "--run-dir", str(run_dir), "--quiet", *TINY, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return json.loads(out), lines


def test_synchronous_ppo_trains_only_on_fresh_data_and_its_actors_wait_for_new_weights(tmp_path):
    summary, lines = _train(tmp_path / "sync", 2000)
    assert summary["env_steps"] >= 2000 and np.isfinite(summary["eval_return_mean"])
    trained = [m for m in lines if "staleness_max" in m]
    assert trained and lines[-1]["updates"] >= 3
    assert lines[-1]["policy_version"] == lines[-1]["updates"] + 1  # one publication per iteration
    assert all(m["staleness_max"] == 0 for m in trained)  # every batch acted by the weights it trains
    # textbook synchronous: the actors wait for each iteration's weights, so no row arrives acted by
    # replaced weights, but for each actor's last batch at the end of the run (send_every 16 rows and
    # an episode's final row): it goes into the spool at once, so as not to be lost, and leaves with
    # the credit the learner grants after its next publication. The only loss is, per actor and
    # iteration, the transition whose successor closed the iteration's last segment (it cannot
    # complete before the learner publishes)
    last_batches = 2 * (16 + 1)
    assert lines[-1]["rows_behind"] <= last_batches
    assert 0 < lines[-1]["discarded"] <= 2 * lines[-1]["policy_version"] + last_batches
    assert all(m["lr_scale"] == 1.0 for m in trained)
    policy = json.loads((tmp_path / "sync" / "policy" / "policy.json").read_text())
    assert policy["algorithm"] == "ppo"


def test_asynchronous_ppo_takes_stale_data_and_reports_staleness_and_ess(tmp_path):
    summary, lines = _train(tmp_path / "async", 2000, "--ppo.max_staleness", "4")
    trained = [m for m in lines if "staleness_max" in m]
    assert trained and lines[-1]["updates"] >= 3
    assert max(m["staleness_max"] for m in trained) >= 1  # actors ran ahead with older weights
    assert all(m["staleness_max"] <= 4 for m in trained)  # never beyond the setting
    for m in trained:
        assert 0 < m["ess_fraction"] <= 1.0 + 1e-5 and 0 < m["lr_scale"] <= 1.0
    assert np.isfinite(summary["eval_return_mean"])


@pytest.mark.parametrize(("key", "value"), [("--ppo.max_staleness", "-1"), ("--ppo.minibatches", "100000")])
def test_bad_ppo_settings_are_refused_by_name(tmp_path, key, value):
    proc = in_process("train", "pendulum", "--algorithm", "ppo", "--run-dir", tmp_path / "bad", key, value)
    assert proc.returncode == 2 and key.removeprefix("--") in proc.stderr


def test_ppo_resume_continues_from_the_checkpoint_with_the_iterations_and_budget_so_far(tmp_path):
    run_dir = tmp_path / "resume"
    _, first = _train(run_dir, 1000)
    done = first[-1]["updates"]
    assert done >= 2 and (run_dir / "checkpoints").is_dir()
    summary, lines = _train(run_dir, 2000, "--resume")
    resumed = lines[len(first):]
    assert resumed[0]["updates"] == done  # the checkpoint at the end of the first run
    assert resumed[0]["env_steps"] >= first[-1]["env_steps"]  # the budget counts on, not from 0
    assert resumed[0]["policy_version"] > first[-1]["policy_version"]  # publications go on
    assert resumed[-1]["updates"] > done and summary["env_steps"] >= 2000
    assert np.isfinite(summary["eval_return_mean"])


@pytest.mark.slow
def test_synchronous_ppo_with_real_time_actors_pauses_them_for_each_iteration_and_counts_it(tmp_path):
    run_dir = tmp_path / "realtime"
    summary, lines = _train(run_dir, 2000, "--actor.realtime", "true", "--actor.time_scale", "10")
    assert lines[-1]["rows_behind"] == 0 and lines[-1]["updates"] >= 3
    assert lines[-1]["discarded"] <= 2 * lines[-1]["policy_version"]
    actors = [json.loads((run_dir / f"actor-{i}.jsonl").read_text().splitlines()[-1]) for i in range(2)]
    for a in actors:  # their clocks kept ticking through the waits, nothing acted meanwhile
        assert a["credit_pauses"] >= 1 and a["credit_paused_steps"] > 0
        assert a["clock"]["ticks"] >= a["env_steps"] + a["credit_paused_steps"]
    assert summary["env_steps"] >= 2000
