"""``embodyrl learner`` and ``embodyrl actor`` as separate processes, pointed at each other by address."""

import json
import os
import signal
import subprocess
import sys

import pytest


def _start(*args):
    return subprocess.Popen([sys.executable, "-m", "embodyrl.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _kill(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_learner_and_two_actors_started_separately_finish_a_run(tmp_path):
    run_dir = tmp_path / "run"
    # long enough that an actor starting seconds after the other still streams: the first to
    # connect inserts 712 rows (min_replay + rate_tolerance) unthrottled, then waits for two
    # updates per row (976 updates); 800 steps at one update each could all come from one actor
    learner = _start("learner", "pendulum", "--run-dir", str(run_dir), "--steps", "1200",
                     "--bind", "tcp://127.0.0.1:*", "--ddpg.hidden_sizes", "[32, 32]",
                     "--learner.min_replay", "200", "--actor.random_steps", "200",
                     "--learner.updates_per_step", "2", "--learner.rate_tolerance", "512")
    actors = []
    try:
        line = learner.stdout.readline()  # blocks until the learner listens (or exits)
        assert line, learner.communicate(timeout=30)[1]
        hello = json.loads(line)
        endpoint = hello["endpoint"]
        assert endpoint.startswith("tcp://127.0.0.1:") and hello["run_dir"] == str(run_dir)
        assert json.loads((run_dir / "learner.json").read_text())["endpoint"] == endpoint
        for index in (0, 1):
            actors.append(_start("actor", "pendulum", "--connect", endpoint, "--index", str(index),
                                 "--config", str(run_dir / "config.json"), "--log-dir", str(tmp_path / "logs")))
        out, err = learner.communicate(timeout=240)
        assert learner.returncode == 0, err
        counters = json.loads(out.strip().splitlines()[-1])
        assert counters["env_steps"] >= 1200 and counters["updates"] > 0
        for actor in actors:
            _, err = actor.communicate(timeout=60)
            assert actor.returncode == 0, err
    finally:
        for proc in (learner, *actors):
            _kill(proc)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(m["actors"] for m in metrics) == 2  # both actors reached the learner
    assert (run_dir / "policy" / "weights.npz").exists()
    for index in (0, 1):
        assert (tmp_path / "logs" / f"actor-{index}.jsonl").read_text().strip()
    # the run directory works with the other commands
    report = subprocess.run([sys.executable, "-m", "embodyrl.cli", "replay", str(run_dir), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert set(json.loads(report.stdout)["rows_by_actor"]) == {"0", "1"}


@pytest.mark.parametrize("args", [
    ("actor", "pendulum", "--connect", "tcp://127.0.0.1:9", "--ddpg.nosuch", "1"),
    ("learner", "pendulum", "--learner.n_step", "0"),
    ("learner", "nosuchtask"),
])
def test_learner_and_actor_reject_bad_config_with_exit_2(args, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "embodyrl.cli", *args, *(
        ("--run-dir", str(tmp_path / "r")) if args[0] == "learner" else ())],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "embodyrl:" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_ppo_learner_resumes_from_the_checkpoint_it_wrote_on_stopping(tmp_path):
    import select

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    from embodyrl.algos.ppo import PPOConfig
    from embodyrl.config import TrainConfig, save

    tiny = PPOConfig(hidden_sizes=(16,), rollout_length=16, rollouts_per_iteration=2, minibatches=2, epochs=1)
    save(TrainConfig(task="pendulum", algorithm="ppo", ppo=tiny), run_dir / "config.json")
    for expected in (None, 0):  # no checkpoint yet; then the one written when the first stopped
        proc = _start("learner", "pendulum", "--run-dir", str(run_dir), "--resume")
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 300)
            assert ready, "the learner printed nothing in 300 s"
            assert json.loads(proc.stdout.readline())["resumed_from_updates"] == expected
            proc.send_signal(signal.SIGINT)
            assert proc.wait(120) == 130, proc.stderr.read()
        finally:
            _kill(proc)
        assert (run_dir / "checkpoints").is_dir()
