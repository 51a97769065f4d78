"""``embodyrl bench ingest``: a learner host's CPU per row as sessions are added, with its steps taken by
ingest workers (``learner.ingest_workers``) or by the learner process itself.

For 1, 2, 4, 8 and 16 sessions: the learner ``embodyrl learner`` builds for the pendulum (DDPG), in this
process, secured with CurveZMQ, training held off (``min_replay`` out of reach, no rate limit: the intake
alone is measured), and the sessions split over two sender processes, each session sending pre-made
64-row batches over its own link whenever its credit allows. After a warm-up, a window is measured:

* ``rows_per_s``: rows the host's replay committed and acknowledged, per second;
* ``host_cpu_us_per_row``: CPU per row of the learner process (its threads: the port that names ingest
  ports, the control channel, the workers' reports) and of every ingest worker (receive, checks, store,
  commits, acks, credit), summed; the senders' CPU is not counted;
* ``worker_cpu_us_per_row`` and ``learner_cpu_us_per_row``: the two parts.

The baseline, in the same run: the learner ingesting itself (``ingest_workers 0``) at 1 and 16 sessions.
``cpu_per_row_vs_one_session``: each count's host CPU per row over the 1-session figure (the goal:
at most 1.25 with two workers at 16 sessions). ``host_32_cores``: rows per second a 32-core host would
take, worked out from the measured CPU per row: 31 cores of workers at the workers' CPU per row, and
the learner process's per-row CPU on the one core left (the smaller bound is the figure).

The senders share this machine's two cores with the host, so ``rows_per_s`` here is what two cores give;
the CPU per row is the figure that carries to a larger host.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path

SESSIONS = (1, 2, 4, 8, 16)
BATCH_ROWS = 64
SENDERS = 2


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sender(endpoint: str, ids: list[int], keys: dict, seconds: float, out) -> None:
    """Sessions ``ids`` of one sender process: send pre-made batches as credit allows, for ``seconds``."""
    import numpy as np

    from embodyrl import envs
    from embodyrl.hal.steps import PolicyVersion, StepRecorder
    from embodyrl.hal.wire import protocol as P
    from embodyrl.hal.wire.client import LearnerLink
    from embodyrl.hal.wire.security import ClientKeys

    device, _ = envs.make("pendulum")
    info = P.DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    links, batches = [], {}
    for i in ids:
        link = LearnerLink(endpoint, actor_name=f"sender {i}", actor_id=i, devices=[info],
                           keys=ClientKeys(Path(keys["session_secrets"][i]), Path(keys["learner_public"])), compression="off", handshake_timeout_s=120)
        link.connect()
        links.append(link)
        recorder = StepRecorder(info.observation_spec, info.action_spec, actor_id=i, device_id=0, capacity=BATCH_ROWS)
        observation = {k: np.zeros(s.shape, s.dtype) for k, s in info.observation_spec.items()}
        action = np.zeros(info.action_spec.shape, info.action_spec.dtype)
        for _ in range(BATCH_ROWS):
            recorder.add(observation, action, action, 0.0, False, False, PolicyVersion(0, -1))
        batches[i] = recorder.flush()
    out.put(("connected", len(links)))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for link in links:
            if link.credits >= BATCH_ROWS and link.unsent_rows < 4 * BATCH_ROWS:
                link.send_steps(0, batches[link.actor_id])
            link.poll(0)
        time.sleep(0.0005)
    for link in links:
        link.close(send_bye=True)
    out.put(("done", 0))


def _measure(workers: int, sessions: int, window_s: float, warm_s: float, work: Path, keys: dict) -> dict:
    from ..config import default_config
    from ..hal.wire.security import ServerKeys
    from ..learner import make_learner

    config = default_config("pendulum")
    config = dataclasses.replace(config, steps=10**12, learner=dataclasses.replace(
        config.learner, ingest_workers=workers, min_replay=10**9, rate_tolerance=10**9, bind="tcp://127.0.0.1:*",
        checkpoint_every_s=3600.0, log_every_s=3600.0))
    run_dir = work / f"run-{workers}-{sessions}"
    learner = make_learner(config, run_dir, keys=ServerKeys(Path(keys["learner_secret"]), Path(keys["authorized"])))
    stop = threading.Event()
    thread = threading.Thread(target=lambda: learner.run(stop.is_set), daemon=True)
    thread.start()
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    ids = list(range(sessions))
    senders = [context.Process(target=_sender, args=(learner.endpoint, ids[k::SENDERS], keys,
                                                     warm_s + window_s + 60, out))
               for k in range(min(SENDERS, sessions))]
    try:
        for p in senders:
            p.start()
        for _ in senders:
            out.get(timeout=180)
        pids = [w.process.pid for w in learner.data.workers.workers] if workers else []

        def sample():
            return (time.monotonic(), learner.counters.rows, time.process_time(), sum(_cpu_s(p) for p in pids))

        time.sleep(warm_s)
        t0, rows0, own0, workers0 = sample()
        time.sleep(window_s)
        t1, rows1, own1, workers1 = sample()
    finally:
        stop.set()
        thread.join(60)
        for p in senders:
            p.terminate()
            p.join(10)
        out.close()
        out.join_thread()
    rows = max(rows1 - rows0, 1)
    learner_cpu, worker_cpu = own1 - own0, workers1 - workers0
    return {"workers": workers, "sessions": sessions, "rows_per_s": round(rows / (t1 - t0)),
            "host_cpu_us_per_row": round(1e6 * (learner_cpu + worker_cpu) / rows, 2),
            "learner_cpu_us_per_row": round(1e6 * learner_cpu / rows, 2),
            "worker_cpu_us_per_row": round(1e6 * worker_cpu / rows, 2) if workers else None}


def _keys(work: Path) -> dict:
    """The learner's key pair and one per session (HELLOs are rate-limited per key, as a fleet's robots
    each hold their own), each bound to its index."""
    from ..hal.wire.security import generate_keys

    learner_public, learner_secret = generate_keys(work / "learner", "learner")
    sessions = [str(generate_keys(work / "authorized", f"session-{i}")[1]) for i in range(max(SESSIONS))]
    (work / "authorized" / "indices.json").write_text(json.dumps({f"session-{i}": [i] for i in range(max(SESSIONS))}))
    return {"learner_public": str(learner_public), "learner_secret": str(learner_secret),
            "session_secrets": sessions, "authorized": str(work / "authorized")}


def run(quick: bool = False) -> dict:
    sessions = (1, 4) if quick else SESSIONS
    window_s, warm_s = (2.0, 2.0) if quick else (6.0, 3.0)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        work = Path(tmp)
        keys = _keys(work)
        with_workers = {str(n): _measure(2, n, window_s, warm_s, work, keys) for n in sessions}
        alone = {str(n): _measure(0, n, window_s, warm_s, work, keys) for n in (sessions[0], sessions[-1])}
    one = with_workers[str(sessions[0])]["host_cpu_us_per_row"]
    most = with_workers[str(sessions[-1])]
    per_row = most["worker_cpu_us_per_row"]
    learner_share = most["learner_cpu_us_per_row"]
    host = {"worker_cores": 31, "rows_per_s_by_workers": round(31e6 / per_row) if per_row else None,
            "rows_per_s_by_learner_core": round(1e6 / learner_share) if learner_share else None}
    host["rows_per_s"] = min(v for v in (host["rows_per_s_by_workers"], host["rows_per_s_by_learner_core"]) if v)
    return {"ingest_workers": 2, "sessions": list(sessions), "by_sessions": with_workers,
            "baseline_learner_ingests": alone,
            "cpu_per_row_vs_one_session": {n: round(r["host_cpu_us_per_row"] / one, 3) for n, r in with_workers.items()},
            "workers_vs_learner_alone_cpu_per_row": {
                n: round(with_workers[n]["host_cpu_us_per_row"] / r["host_cpu_us_per_row"], 3) for n, r in alone.items()},
            "host_32_cores": host, "batch_rows": BATCH_ROWS, "senders": SENDERS,
            "link": "CurveZMQ over loopback", "window_s": window_s, "task": "pendulum"}
