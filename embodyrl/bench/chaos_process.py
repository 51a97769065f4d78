"""Chaos with the real processes: ``embodyrl learner`` and ``embodyrl actor`` killed with SIGKILL.

The learner is the real one (JAX, persistent replay, Orbax checkpoints). It
is killed and restarted with ``--resume`` on the same address; nobody tells
the actors: they notice the silence, keep their devices safe, spool, dial
again by themselves and resend what the dead learner had not acknowledged.
Actors are killed too and restarted on their spool directories. Exact once
is checked from both ends: each actor's ledger (every batch its link took:
rows and a digest of row identities, :mod:`embodyrl.hal.ledger`) against the
rows and digest per actor that the replay holds (``embodyrl replay --json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..cli.replay_report import inspect, replay_directories
from ..hal.ledger import ledger_totals, read_ledger
from ..replay.contents import newest_commit
from .chaos_parts import free_port

SMALL = ["--ddpg.hidden_sizes", "[64, 64]", "--ddpg.batch_size", "128", "--learner.min_replay", "500",
         "--actor.random_steps", "500", "--learner.checkpoint_every_s", "2", "--learner.peer_timeout_s", "3",
         "--learner.log_every_s", "1"]


class ProcessRun:
    """A learner and its actors as separate ``embodyrl`` processes sharing one work directory."""

    def __init__(self, work: Path, actors: int, replay_capacity: int, extra: list[str] | None = None):
        self.work = Path(work)
        self.run_dir = self.work / "run"
        self.logs = self.work / "logs"
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.options = [*SMALL, "--learner.replay_capacity", str(replay_capacity), *(extra or [])]
        self.learner: subprocess.Popen | None = None
        self.actors: dict[int, subprocess.Popen] = {}
        self.learner_starts: list[dict] = []
        self.n_actors = actors

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        out = (self.work / f"{name}.out").open("a")
        return subprocess.Popen([sys.executable, "-m", "embodyrl.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def start_learner(self, resume: bool, timeout_s: float = 120.0) -> float:
        """Start (or resume) the learner; seconds until it listens."""
        out = self.work / "learner.out"
        seen = out.read_text().count("\n") if out.exists() else 0
        start = time.monotonic()
        self.learner = self._spawn("learner", "learner", "pendulum", "--run-dir", str(self.run_dir),
                                   "--bind", self.endpoint, "--steps", str(10**12), *self.options,
                                   *(["--resume"] if resume else []))
        while time.monotonic() - start < timeout_s:
            lines = out.read_text().splitlines()[seen:]
            for line in lines:
                if line.startswith("{") and '"endpoint"' in line:
                    self.learner_starts.append(json.loads(line))
                    return time.monotonic() - start
            if self.learner.poll() is not None:
                raise RuntimeError(f"learner exited with {self.learner.returncode}: {out.read_text()[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"learner did not listen within {timeout_s} s")

    def start_actor(self, index: int, max_steps: int | None = None) -> None:
        self.actors[index] = self._spawn(
            f"actor-{index}", "actor", "pendulum", "--connect", self.endpoint, "--index", str(index),
            "--config", str(self.run_dir / "config.json"), "--log-dir", str(self.logs),
            "--actor.spool_dir", str(self.work / "spool"),
            *(["--max-steps", str(max_steps)] if max_steps else []))

    def kill(self, proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def stop(self, proc: subprocess.Popen, timeout_s: float = 60.0) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            return -9

    def ledgered(self) -> dict[int, tuple[int, int]]:
        return {i: ledger_totals(self.logs / f"actor-{i}.ledger.jsonl") for i in range(self.n_actors)}

    def ledgered_seqs(self) -> dict[int, int]:
        return {i: max(read_ledger(self.logs / f"actor-{i}.ledger.jsonl"), default=0) for i in range(self.n_actors)}

    def stored(self) -> dict[int, tuple[int, int]]:
        """Rows and digest per actor in the replay's newest commit (read-only, safe while it runs)."""
        report = inspect(self.run_dir)
        return {int(a): (n, int(report["digest_by_actor"][a])) for a, n in report["rows_by_actor"].items()}

    def committed_seqs(self) -> dict[int, int]:
        """Each actor's newest batch in the replay's newest commit (the index alone: cheap)."""
        seqs = {}
        try:
            for directory in replay_directories(self.run_dir):
                body = newest_commit(directory)
                seqs.update({int(a): int(q) for a, q in (body or {}).get("actor_seqs", {}).items()})
        except (FileNotFoundError, ValueError):
            return {}
        return seqs

    def wait_stored(self, target: dict[int, int], timeout_s: float) -> bool:
        """Until the replay has committed, for every actor, the batches up to ``target[actor]``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            committed = self.committed_seqs()
            if all(committed.get(i, 0) >= seq for i, seq in target.items()):
                return True
            time.sleep(0.25)
        return False

    def checkpointed_updates(self) -> int:
        """The newest checkpoint's step: gradient updates it holds (0 if none yet)."""
        directory = self.run_dir / "checkpoints"
        return max((int(p.name) for p in directory.iterdir() if p.name.isdigit()), default=0) \
            if directory.exists() else 0

    def close(self) -> None:
        for proc in (self.learner, *self.actors.values()):
            if proc is not None and proc.poll() is None:
                self.kill(proc)


def refused_by_reason(run_dir: Path) -> dict[str, int]:
    """What the learner refused or failed to send, by reason, summed over its lives (each life's
    counters start at zero; ``send_failed``: a reply to a connection that was gone)."""
    totals: dict[str, int] = {}
    life: dict[str, int] = {}
    last_in = -1
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return totals
    for line in lines:
        try:
            record = json.loads(line)
            messages_in, reasons = int(record["messages_in"]), dict(record["rejected_by_reason"])
        except (ValueError, KeyError, TypeError):
            continue
        if messages_in < last_in:  # a new learner life
            for reason, n in life.items():
                totals[reason] = totals.get(reason, 0) + n
        life, last_in = reasons, messages_in
    for reason, n in life.items():
        totals[reason] = totals.get(reason, 0) + n
    return totals


def compare(produced: dict[int, tuple[int, int]], stored: dict[int, tuple[int, int]]) -> dict:
    """Ledger against replay: rows and digests summed; a digest mismatch at equal counts is a loss
    and a duplicate at once (some row stored twice, another never)."""
    rows_p = sum(r for r, _ in produced.values())
    rows_s = sum(r for r, _ in stored.values())
    digest_match = all(stored.get(i, (0, 0)) == totals for i, totals in produced.items()) and \
        set(stored) <= set(produced)
    lost, duplicated = max(rows_p - rows_s, 0), max(rows_s - rows_p, 0)
    if not digest_match and lost == duplicated == 0:
        lost = duplicated = 1
    return {"produced": rows_p, "stored": rows_s, "lost": lost, "duplicated": duplicated,
            "digest_match": digest_match}


def learner_sigkill(quick: bool, ingest_workers: int = 0) -> dict:
    """Real learner SIGKILLed mid-training (after a checkpoint), restarted with ``--resume``; one actor
    SIGKILLed and restarted on its spool; the actors finish a fixed number of steps and exit 0 (an
    actor exits 0 only once the learner holds every row it spooled). ``learner_refused``: what the
    learner refused or failed to send, by reason (``send_failed``: a reply to a dead connection).
    ``ingest_workers``: the learner's (``learner.ingest_workers``), killed with it."""
    kills = 1 if quick else 3
    steps = 1500 if quick else 6000
    work = Path(tempfile.mkdtemp(prefix="chaos-process-"))
    run = ProcessRun(work, actors=2, replay_capacity=65536,
                     extra=["--learner.ingest_workers", str(ingest_workers)] if ingest_workers else None)
    recoveries, restarts, resumed = [], [], []
    try:
        run.start_learner(resume=False)
        for i in range(2):
            run.start_actor(i, max_steps=steps)
        for k in range(kills):
            before = run.checkpointed_updates()
            deadline = time.monotonic() + 120
            while run.checkpointed_updates() <= before and time.monotonic() < deadline:
                time.sleep(0.2)  # kill mid-training, after the learner has checkpointed its updates
            time.sleep(0.5)
            run.kill(run.learner)
            killed = time.monotonic()
            if k == 0:  # an actor dies too, while the learner is down
                run.kill(run.actors[1])
                run.start_actor(1, max_steps=steps)
            target = run.ledgered_seqs()
            restarts.append(run.start_learner(resume=True))
            resumed.append(run.learner_starts[-1]["resumed_from_updates"])
            if not run.wait_stored(target, 180):
                exited = {i: p.poll() for i, p in run.actors.items() if p.poll() is not None}
                raise TimeoutError(f"rows spooled before the kill (seqs {target}) never reached the restarted "
                                   f"learner (it holds {run.committed_seqs()}; actors exited: {exited})")
            recoveries.append(time.monotonic() - killed)
        for i, proc in run.actors.items():
            code = proc.wait(300)
            if code != 0:
                raise RuntimeError(f"actor {i} exited with {code}: {(work / f'actor-{i}.out').read_text()[-2000:]}")
        run.stop(run.learner)
        result = compare(run.ledgered(), run.stored())
        refused = refused_by_reason(run.run_dir)
    finally:
        run.close()
    shutil.rmtree(work, ignore_errors=True)
    return {"name": "learner_sigkill_process", "injected": kills + 1, **result, "learner_refused": refused,
            "recovery_s": statistics.median(recoveries), "learner_restart_s": statistics.median(restarts),
            "resumed_from_updates": resumed, "actor_kills": 1, "learner_kills": kills}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _proc_figures(pid: int) -> tuple[float, float, int]:
    """(anonymous RSS MB, file-backed RSS MB, open file descriptors) of a process."""
    anon = file = 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) / 1024
            elif line.startswith("RssFile:"):
                file = int(line.split()[1]) / 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return 0.0, 0.0, 0
    return anon, file, fds


def _replay_size(run: ProcessRun) -> int:
    try:
        lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        with contextlib.suppress(ValueError, KeyError):
            return int(json.loads(line)["replay_size"])
    return 0


def soak(seconds: float, fault_every_s: float = 60.0, sample_every_s: float = 10.0, actors: int = 2,
         out: str | None = None, kill_learner: bool = True) -> dict:
    """The real learner and actors for ``seconds``; every ``fault_every_s`` the learner, then each
    actor in turn, is SIGKILLed and restarted (only the actors without ``kill_learner``: one learner
    life, to see its memory over the whole run). Samples memory, file handles and throughput over
    time; ends with the exact-once count. Not for CI: an hour is its point."""
    work = Path(tempfile.mkdtemp(prefix="chaos-soak-"))
    run = ProcessRun(work, actors=actors, replay_capacity=8 << 20)
    samples, recoveries, faults = [], {"learner": [], "actor": []}, 0
    rotation = actors + 1 if kill_learner else actors
    try:
        run.start_learner(resume=False)
        for i in range(actors):
            run.start_actor(i)
        start = next_fault = time.monotonic()
        next_fault += fault_every_s
        last_size, last_t = 0, start
        while time.monotonic() - start < seconds:
            time.sleep(sample_every_s)
            now = time.monotonic()
            size = _replay_size(run)
            learner = _proc_figures(run.learner.pid)
            actor_figures = [_proc_figures(p.pid) for p in run.actors.values()]
            samples.append({"t": round(now - start, 1), "rows_per_s": round((size - last_size) / (now - last_t), 1),
                            "replay_size": size, "learner_anon_mb": round(learner[0], 1),
                            "learner_file_mb": round(learner[1], 1), "learner_fds": learner[2],
                            "actors_anon_mb": round(sum(a[0] for a in actor_figures), 1),
                            "actors_fds": sum(a[2] for a in actor_figures), "faults": faults})
            last_size, last_t = size, now
            if out:
                Path(out).write_text(json.dumps({"samples": samples}) + "\n")
            if now >= next_fault:
                target = run.ledgered_seqs()
                killed = time.monotonic()
                victim = faults % rotation - (1 if kill_learner else 0)  # -1: the learner
                if victim < 0:
                    run.kill(run.learner)
                    run.start_learner(resume=True)
                else:
                    run.kill(run.actors[victim])
                    run.start_actor(victim)
                faults += 1
                if run.wait_stored(target, 300):
                    recoveries["learner" if victim < 0 else "actor"].append(time.monotonic() - killed)
                next_fault = time.monotonic() + fault_every_s
        for proc in run.actors.values():
            run.stop(proc, 120)
        run.stop(run.learner, 120)
        result = compare(run.ledgered(), run.stored())
    finally:
        run.close()
    shutil.rmtree(work, ignore_errors=True)
    quarter = max(len(samples) // 4, 1)

    def drift(key: str) -> float:
        first = statistics.median(s[key] for s in samples[:quarter])
        last = statistics.median(s[key] for s in samples[-quarter:])
        return round(last / first, 3) if first else 0.0

    return {"name": "soak_process", "injected": faults, **result,
            "recovery_s": _median(recoveries["learner"] + recoveries["actor"]),
            "recovery_s_learner_kill": _median(recoveries["learner"]),
            "recovery_s_actor_kill": _median(recoveries["actor"]), "soak_s": seconds,
            "learner_anon_mb_ratio_last_first_quarter": drift("learner_anon_mb"),
            "actors_anon_mb_ratio_last_first_quarter": drift("actors_anon_mb"),
            "learner_fds_ratio_last_first_quarter": drift("learner_fds"),
            "actors_fds_ratio_last_first_quarter": drift("actors_fds"),
            "rows_per_s_ratio_last_first_quarter": drift("rows_per_s"),
            "rows_per_s_median": statistics.median(s["rows_per_s"] for s in samples) if samples else 0.0,
            "samples": samples}
