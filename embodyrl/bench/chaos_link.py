"""Chaos scenarios on a live link: kill the actor, kill the learner side, partition the network,
attack the server, slow the learner down. Every row an actor produced is checked against what the
learner stored, by key: nothing lost, nothing stored twice.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics
import time
from pathlib import Path

from .chaos_parts import (
    LearnerSide,
    checksum,
    free_port,
    in_scratch_dir,
    logged_rows,
    logging_actor,
    rss_bytes,
    spool_bytes,
    tcp_proxy,
)

CTX = mp.get_context("spawn")


def _record(name: str, injected: int, produced: list, stored: list, recoveries: list[float], **extra) -> dict:
    produced_set, stored_set = set(produced), set(stored)
    # a row handed to the link (spooled) by an actor killed before it wrote the row's log line
    extra["stored_not_logged"] = len(stored_set - produced_set)
    return {"name": name, "injected": injected, "produced": len(produced), "stored": len(stored),
            "lost": len(produced_set - stored_set), "duplicated": len(stored) - len(stored_set),
            "recovery_s": statistics.median(recoveries) if recoveries else 0.0,
            "recovery_s_max": max(recoveries) if recoveries else 0.0,
            "checksum_match": checksum(produced) == checksum(stored), **extra}


def _start_actor(endpoint: str, work: Path, actor_id: int, max_steps: int, stop=None, **kwargs):
    process = CTX.Process(target=logging_actor, args=(endpoint, actor_id, str(work / f"spool-{actor_id}"),
                                                      str(work / f"rows-{actor_id}.jsonl"), max_steps, stop),
                          kwargs=kwargs)
    process.start()
    return process


def _finish(learner: LearnerSide, actor, timeout_s: float = 90) -> None:
    learner.serve_until(lambda: not actor.is_alive(), timeout_s)
    actor.join(5)
    if actor.is_alive():
        actor.kill()
        actor.join(5)
        raise RuntimeError("the actor did not finish draining its spool in time")
    if actor.exitcode != 0:
        raise RuntimeError(f"the actor exited with {actor.exitcode}")


def _wait_stored(learner: LearnerSide, rows, timeout_s: float = 60) -> float:
    """Seconds until every one of ``rows`` is stored."""
    start, wanted = time.monotonic(), set(rows)
    learner.serve_until(lambda: wanted <= set(learner.rows), timeout_s)
    return time.monotonic() - start


@in_scratch_dir("chaos-actor-")
def actor_kill(quick: bool, work: Path) -> dict:
    """SIGKILL the actor N times mid-stream; each restart resends its spool."""
    kills, run_s = (2, 1.0) if quick else (5, 3.0)
    learner = LearnerSide(free_port())
    learner.start()
    endpoint = f"tcp://127.0.0.1:{learner.port}"
    recoveries, spooled = [], []
    try:
        for _ in range(kills):
            actor = _start_actor(endpoint, work, 1, 10**9)
            stored = len(learner.rows)
            learner.serve_until(lambda stored=stored: len(learner.rows) > stored, 60)  # started and streaming (slow under load)
            learner.serve(run_s)
            learner.serve(0.5, accept=False)  # lost in flight: only the spool still has these rows
            os.kill(actor.pid, signal.SIGKILL)
            actor.join(10)
            before = logged_rows(work / "rows-1.jsonl")
            spooled.append(len(set(before) - set(learner.rows)))
            actor = _start_actor(endpoint, work, 1, 0)  # resend the spool, then exit
            recoveries.append(_wait_stored(learner, before))
            _finish(learner, actor)
        stop = CTX.Event()
        actor = _start_actor(endpoint, work, 1, 10**9, stop)
        learner.serve(run_s)
        stop.set()
        _finish(learner, actor)
    finally:
        learner.close()
    return _record("actor_kill_restart", kills, logged_rows(work / "rows-1.jsonl"), learner.rows, recoveries,
                   unacked_at_kill=spooled, resends_dropped=learner.resends_dropped)


@in_scratch_dir("chaos-learner-")
def learner_kill(quick: bool, work: Path) -> dict:
    """Kill the learner side N times (no BYE, in-flight lost); restart on the same port."""
    kills, run_s, down_s = (2, 1.0, 1.0) if quick else (5, 3.0, 3.0)
    learner = LearnerSide(free_port())
    learner.start()
    stop = CTX.Event()
    actor = _start_actor(f"tcp://127.0.0.1:{learner.port}", work, 2, 10**9, stop)
    recoveries = []
    try:
        learner.serve_until(lambda: bool(learner.rows), 30)
        for _ in range(kills):
            learner.serve(run_s)
            learner.crash()
            time.sleep(down_s)  # the actor keeps stepping and spools
            before = logged_rows(work / "rows-2.jsonl")
            learner.start()
            recoveries.append(_wait_stored(learner, before))
        stop.set()
        _finish(learner, actor)
    finally:
        if actor.is_alive():
            actor.kill()
        learner.close()
    return _record("learner_kill_restart", kills, logged_rows(work / "rows-2.jsonl"), learner.rows, recoveries,
                   down_s=down_s, resends_dropped=learner.resends_dropped)


@in_scratch_dir("chaos-partition-")
def partition(quick: bool, work: Path) -> dict:
    """Cut the actor off (a proxy drops every connection) for T seconds, N times."""
    cuts, run_s, cut_s = (1, 1.5, 2.0) if quick else (3, 3.0, 5.0)
    learner = LearnerSide(free_port())
    learner.start()
    proxy_port, partitioned, ready = free_port(), CTX.Event(), CTX.Event()
    proxy = CTX.Process(target=tcp_proxy, args=(proxy_port, learner.port, partitioned, ready), daemon=True)
    proxy.start()
    ready.wait(30)
    stop = CTX.Event()
    actor = _start_actor(f"tcp://127.0.0.1:{proxy_port}", work, 3, 10**9, stop, realtime=True)
    log = work / "rows-3.jsonl"
    recoveries, produced_during, stored_during, rate_before, rate_during = [], [], [], [], []
    try:
        learner.serve_until(lambda: bool(learner.rows), 30)
        for _ in range(cuts):
            produced_at_start = len(logged_rows(log))
            learner.serve(run_s)
            rate_before.append((len(logged_rows(log)) - produced_at_start) / run_s)
            partitioned.set()
            produced_at_cut, stored_at_cut = len(logged_rows(log)), len(learner.rows)
            learner.serve(cut_s)
            produced_during.append(len(logged_rows(log)) - produced_at_cut)
            rate_during.append(produced_during[-1] / cut_s)
            stored_during.append(len(learner.rows) - stored_at_cut)
            before = logged_rows(log)
            partitioned.clear()
            recoveries.append(_wait_stored(learner, before))
        stop.set()
        _finish(learner, actor)
    finally:
        for p in (actor, proxy):
            if p.is_alive():
                p.kill()
                p.join(5)
        learner.close()
    return _record("network_partition", cuts, logged_rows(log), learner.rows, recoveries, partition_s=cut_s,
                   rows_produced_during_partition=produced_during,
                   rows_stored_during_partition=stored_during,
                   actor_rows_per_s_before=statistics.median(rate_before),
                   actor_rows_per_s_during=statistics.median(rate_during))


def _attack_batch(rng, template) -> list[list[bytes]]:
    import msgpack
    import numpy as np

    from embodyrl.hal.wire import protocol as P
    from embodyrl.hal.wire.codec import PROTOCOL_VERSION, encode

    nan = dict(template)
    nan["observation/orientation"] = np.full_like(nan["observation/orientation"], np.nan)
    return [[rng.bytes(int(rng.integers(1, 200)))],
            [msgpack.packb({"p": PROTOCOL_VERSION, "k": P.STEPS, "f": {"seq": 1}, "a": [["x", "float32", [1 << 30]]]}),
             b"\x00" * 16],
            encode(P.STEPS, {"seq": 5, "device_id": 0, "held": [0, -1]}, {"x": np.zeros(3)})[:1],
            encode(P.HELLO, {"actor": "evil", "actor_id": 9, "devices": [{"name": 1}], "held": [0, -1]}),
            encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [0, -1]}, nan)]


def _template():
    import numpy as np

    from embodyrl import envs
    from embodyrl.hal.steps import PolicyVersion, StepRecorder

    device, _ = envs.make("pendulum")
    rec = StepRecorder(device.observation_spec, device.action_spec, actor_id=0, device_id=0)
    with device:
        obs = device.reset(seed=0)
        for _ in range(4):
            rec.add(obs, np.zeros(1, np.float32), np.zeros(1, np.float32), 0.0, False, False, PolicyVersion(1, 1))
    return rec.flush().arrays()


@in_scratch_dir("chaos-hostile-")
def hostile(quick: bool, work: Path) -> dict:
    """Alternate quiet and attacked windows while an honest actor streams; compare its stored rate."""
    import numpy as np
    import zmq

    pairs, window_s = (2, 1.0) if quick else (5, 2.0)
    learner = LearnerSide(free_port())
    learner.start()
    stop = CTX.Event()
    actor = _start_actor(f"tcp://127.0.0.1:{learner.port}", work, 4, 10**9, stop, peer_timeout_s=10.0)
    attacker = zmq.Context.instance().socket(zmq.DEALER)
    attacker.setsockopt(zmq.LINGER, 0)
    attacker.connect(f"tcp://127.0.0.1:{learner.port}")
    rng, template = np.random.default_rng(0), _template()
    quiet, attacked, attacks = [], [], 0
    try:
        learner.serve_until(lambda: bool(learner.rows), 30)
        learner.serve(0.5)
        for _ in range(pairs):
            for under_attack in (False, True):
                start_rows, start = len(learner.rows), time.monotonic()
                while time.monotonic() - start < window_s:
                    if under_attack:
                        for frames in _attack_batch(rng, template):
                            attacker.send_multipart(frames)
                            attacks += 1
                    learner.serve(0.005)
                rate = (len(learner.rows) - start_rows) / (time.monotonic() - start)
                (attacked if under_attack else quiet).append(rate)
        stop.set()
        _finish(learner, actor)
        rejected = dict(learner.server.stats.rejected)
        honest_sessions = all(s.actor_id == 4 for s in learner.server.sessions.values())
    finally:
        if actor.is_alive():
            actor.kill()
        attacker.close(0)
        learner.close()
    quiet_rate, attacked_rate = statistics.median(quiet), statistics.median(attacked)
    return _record("hostile_traffic", attacks, logged_rows(work / "rows-4.jsonl"), learner.rows, [],
                   rejected=sum(rejected.values()), rejected_by_reason=rejected,
                   only_honest_sessions=honest_sessions, honest_rows_per_s_quiet=quiet_rate,
                   honest_rows_per_s_attacked=attacked_rate,
                   throughput_ratio=attacked_rate / quiet_rate if quiet_rate else 0.0)


@in_scratch_dir("chaos-slow-")
def slow_learner(quick: bool, work: Path) -> dict:
    """A learner that takes 20 ms per batch: credits bound the actor; its memory and spool stay flat."""
    run_s, delay_s = (4.0, 0.02) if quick else (20.0, 0.02)
    learner = LearnerSide(free_port(), delay_s=delay_s)
    learner.start()
    stop = CTX.Event()
    actor = _start_actor(f"tcp://127.0.0.1:{learner.port}", work, 5, 10**9, stop, peer_timeout_s=10.0)
    samples = []
    try:
        learner.serve_until(lambda: bool(learner.rows), 30)
        start = time.monotonic()
        while time.monotonic() - start < run_s:
            learner.serve(0.5)
            produced = len(logged_rows(work / "rows-5.jsonl"))
            samples.append({"t": round(time.monotonic() - start, 2), "actor_rss_mb": rss_bytes(actor.pid) / 2**20,
                            "spool_kb": spool_bytes(work / "spool-5") / 1024,
                            "unacked_rows": produced - len(learner.rows)})
        stop.set()
        _finish(learner, actor)
    finally:
        if actor.is_alive():
            actor.kill()
        learner.close()
    half = len(samples) // 2
    rss_first = statistics.median(s["actor_rss_mb"] for s in samples[:max(1, half)])
    rss_last = statistics.median(s["actor_rss_mb"] for s in samples[half:])
    return _record("slow_learner", 1, logged_rows(work / "rows-5.jsonl"), learner.rows, [], delay_per_batch_s=delay_s,
                   max_unacked_rows=max(s["unacked_rows"] for s in samples),
                   max_spool_kb=max(s["spool_kb"] for s in samples),
                   max_learner_poll_batches=learner.max_backlog,
                   actor_rss_mb_first_half=rss_first, actor_rss_mb_second_half=rss_last,
                   rss_growth_ratio=rss_last / rss_first if rss_first else 0.0, samples=samples)
