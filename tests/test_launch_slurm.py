"""``embodyrl launch slurm`` against a real one-node Slurm cluster (Debian's slurm-wlm and munge,
started here from ``tests/slurm/slurm.conf.in``): the scripts pass ``sbatch --test-only``; a
learner and two actors run end to end, one actor requeued mid-run, and the batch ledgers against
the replay show every row arrived once. Where the daemons cannot run, the tests say why and skip."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

CONF = Path(__file__).parent / "slurm" / "slurm.conf.in"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, **kw)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}; .ci/setup installs slurm-wlm and munge)")
    if os.geteuid() != 0:
        pytest.skip("slurmd runs jobs as their users and must be started as root")
    directory = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (directory / sub).mkdir()
    key = directory / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    host = socket.gethostname()
    text = CONF.read_text()
    for name, value in {"@DIR@": str(directory), "@HOST@": host, "@CPUS@": str(os.cpu_count() or 2),
                        "@CTLD_PORT@": str(_free_port()), "@SLURMD_PORT@": str(_free_port())}.items():
        text = text.replace(name, value)
    conf = directory / "slurm.conf"
    conf.write_text(text)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = [_run("munged", "-f", f"--key-file={key}", f"--socket={directory}/munge.socket",
                    f"--pid-file={directory}/munged.pid", f"--log-file={directory}/munged.log",
                    f"--seed-file={directory}/munged.seed")]
    started.append(_run("slurmctld", "-c", env=env))
    started.append(_run("slurmd", env=env))
    if any(p.returncode for p in started):
        pytest.skip("the Slurm daemons did not start here: " + "; ".join(p.stderr.strip() for p in started if p.returncode))
    deadline = time.monotonic() + 60
    while "idle" not in _run("sinfo", "--noheader", "--format=%T", env=env).stdout:
        if time.monotonic() > deadline:
            pytest.skip(f"the Slurm node never became idle: {(directory / 'slurmd.log').read_text()[-1000:]}")
        time.sleep(1)
    os.environ["SLURM_CONF"] = str(conf)  # sbatch, squeue and scancel of this process's launches
    try:
        yield directory
    finally:
        _run("scancel", "--user=root", env=env)
        for daemon in ("slurmd", "slurmctld"):
            pid = directory / f"{daemon}.pid"
            if pid.exists():
                _run("kill", pid.read_text().strip())
        _run("munged", "-s", f"--socket={directory}/munge.socket")
        os.environ.pop("SLURM_CONF", None)


def _launch(run_dir: Path, steps: int, actors: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "embodyrl.cli", "launch", "slurm", "pendulum", "--actors", str(actors),
         "--steps", str(steps), "--run-dir", str(run_dir), "--eval_episodes", "1", "--learner.min_replay", "300",
         "--actor.random_steps", "300", "--sac.hidden_sizes", "[32, 32]", "--learner.peer_timeout_s", "10",
         "--key-dir", str(run_dir.parent / "node-keys"), *extra], capture_output=True, text=True, timeout=1800)


def test_dry_run_scripts_pass_sbatch_test_only(slurm, tmp_path):
    proc = _launch(tmp_path / "run", 1000, 3, "--dry-run", "--partition", "debug", "--time", "00:30:00",
                   "--sbatch=--comment=embodyrl", "--coupled-command", "python3 -c pass", "--coupled-ranks", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    scripts = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])["scripts"]
    actors = Path(scripts[1]).read_text()
    assert "#SBATCH --array=0-2" in actors and "srun --ntasks=1 python3 -c pass &" in actors
    assert "#SBATCH --partition=debug" in actors and "#SBATCH --comment=embodyrl" in actors
    for script in scripts:
        check = _run("sbatch", "--test-only", script)
        assert check.returncode == 0 and "to start at" in check.stderr, check.stderr
    assert not list((tmp_path / "run").glob("slurm-*.out"))  # nothing was submitted


@pytest.mark.slow
def test_a_learner_and_two_actors_with_one_requeued_lose_nothing(slurm, tmp_path):
    run = tmp_path / "run"
    proc = _launch(run, 3000, 2, "--actor.realtime", "true")  # paced (20 steps/s each): time to requeue one
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])
    ledger = run / "actor-1.ledger.jsonl"
    deadline = time.monotonic() + 600
    while not (ledger.exists() and len(ledger.read_text().splitlines()) >= 5):  # actor 1 is streaming
        assert time.monotonic() < deadline, (run / "rendezvous").exists()
        time.sleep(1)
    task = f"{jobs['actors_job']}_1"
    requeue = _run("scontrol", "requeue", task)
    assert requeue.returncode == 0, requeue.stderr
    # Slurm holds a requeued job for two minutes once it is back in the queue; an administrator's
    # release, so the test need not wait
    while "PENDING" not in _run("squeue", "-h", "-j", task, "-o", "%T").stdout:
        assert time.monotonic() < deadline, "the requeued actor never went back to the queue"
        time.sleep(0.5)
    assert _run("scontrol", "update", f"jobid={task}", "starttime=now").returncode == 0
    log = run / "actor-1.jsonl"
    while not _restarted(log):  # Slurm starts the requeued task again (a new process: its counts start over)
        assert time.monotonic() < deadline and _run("squeue", "-h", "-j", jobs["learner_job"]).stdout.strip(), \
            "the requeued actor did not start again while the learner ran"
        time.sleep(1)
    from embodyrl.cluster.slurm_backend import wait_for

    wait_for(jobs["learner_job"], 1500)
    counters = json.loads((run / f"slurm-learner-{jobs['learner_job']}.out").read_text().strip().splitlines()[-1])
    assert counters["env_steps"] >= 3000
    from tests.ledger_helpers import exactly_once

    exactly_once(run, 2)


def _restarted(log: Path) -> bool:
    steps = [json.loads(line)["env_steps"] for line in log.read_text().splitlines() if line.strip()]
    return any(later < earlier for earlier, later in zip(steps, steps[1:], strict=False))
