"""Chaos scenarios on a live link: kill the actor, kill the learner side, partition the network,
attack the learner (the attackers are :mod:`.chaos_hostile`), slow the learner down. Every row an
actor's link took is checked against what the learner side's persistent replay holds: nothing
lost, nothing stored twice.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import time
from pathlib import Path

from ..hal.ledger import read_ledger
from ..transport.server import SEND_FAILED, UNSENT
from . import chaos_hostile
from .chaos_parts import (
    LearnerSide,
    exact_once,
    free_port,
    in_scratch_dir,
    ledger_actor,
    ledgered,
    own_memory_mb,
    reset_peak_memory,
    rss_bytes,
    spool_bytes,
    stored_rows,
    stored_steps,
    tcp_proxy,
)

CTX = mp.get_context("spawn")


def record(name: str, injected: int, ledgers: dict[int, Path], learner: LearnerSide, recoveries: list[float],
           **extra) -> dict:
    """The scenario's record: each actor's ledger against the replay (the learner side closed)."""
    learner.close()
    counts = exact_once(ledgers, learner.directory)
    return {"name": name, "injected": injected, **counts,
            "recovery_s": statistics.median(recoveries) if recoveries else 0.0,
            "recovery_s_max": max(recoveries) if recoveries else 0.0,
            "resends_dropped": learner.resends_dropped, **extra}


def start_actor(endpoint: str, work: Path, actor_id: int, max_steps: int, stop=None, **kwargs):
    process = CTX.Process(target=ledger_actor, args=(endpoint, actor_id, str(work / f"spool-{actor_id}"),
                                                     str(work / f"ledger-{actor_id}.jsonl"), max_steps, stop),
                          kwargs=kwargs)
    process.start()
    return process


def finish(learner: LearnerSide, actor, timeout_s: float = 90) -> None:
    """Serve until the actor has drained its spool and exited cleanly."""
    learner.serve_until(lambda: not actor.is_alive(), timeout_s)
    actor.join(5)
    if actor.is_alive():
        actor.kill()
        actor.join(5)
        raise RuntimeError("the actor did not finish draining its spool in time")
    if actor.exitcode != 0:
        raise RuntimeError(f"the actor exited with {actor.exitcode}")


def kill(*processes) -> None:
    for p in processes:
        if p is not None and p.is_alive():
            p.kill()
            p.join(5)


@in_scratch_dir("chaos-actor-")
def actor_kill(quick: bool, work: Path) -> dict:
    """SIGKILL the actor N times mid-stream; each restart resends its spool and the rows its journal
    holds (recorded, not yet batched). ``stepped_not_stored``: the device's steps (counted in shared
    memory, which outlives the kill) that the replay lacks at the end: at most the step each kill
    interrupted between the device and the recorder."""
    kills, run_s = (2, 1.0) if quick else (5, 3.0)
    stepped = CTX.Value("q", 0, lock=False)
    learner = LearnerSide(free_port(), work / "replay")
    learner.start()
    ledger = work / "ledger-1.jsonl"
    recoveries, spooled = [], []
    actor = None
    try:
        for _ in range(kills):
            actor = start_actor(learner.endpoint, work, 1, 10**9, stepped=stepped)
            taken = learner.taken.get(1, 0)
            learner.serve_until(lambda taken=taken: learner.taken.get(1, 0) > taken, 60)  # streaming (slow under load)
            learner.serve(run_s)
            learner.serve(0.5, accept=False)  # lost in flight: only the spool still has these rows
            os.kill(actor.pid, signal.SIGKILL)
            actor.join(10)
            # what the ledger names beyond the replay's durable seq lives only in the spool
            durable = learner.committed().get(1, 0)
            spooled.append(sum(rows for s, (rows, _) in read_ledger(ledger).items() if s > durable))
            _, seq = ledgered(ledger)
            actor = start_actor(learner.endpoint, work, 1, 0)  # resend the spool, then exit
            recoveries.append(learner.wait_durable({1: seq}))
            finish(learner, actor)
        stop = CTX.Event()
        actor = start_actor(learner.endpoint, work, 1, 10**9, stop, stepped=stepped)
        learner.serve(run_s)
        stop.set()
        finish(learner, actor)
    except BaseException:
        kill(actor)
        learner.close()
        raise
    result = record("actor_kill_restart", kills, {1: ledger}, learner, recoveries, unacked_at_kill=spooled)
    return {**result, "stepped": stepped.value,
            "stepped_not_stored": stepped.value - stored_steps(learner.directory, 1)}


@in_scratch_dir("chaos-learner-")
def learner_kill(quick: bool, work: Path) -> dict:
    """Crash the learner side N times (no BYE, no final commit: in-flight and uncommitted rows
    lost); restart it on the same port and replay directory, which is all it keeps."""
    kills, run_s, down_s = (2, 1.0, 1.0) if quick else (5, 3.0, 3.0)
    learner = LearnerSide(free_port(), work / "replay")
    learner.start()
    stop = CTX.Event()
    actor = start_actor(learner.endpoint, work, 2, 10**9, stop)
    ledger = work / "ledger-2.jsonl"
    recoveries, uncommitted = [], []
    try:
        learner.serve_until(lambda: learner.taken.get(2, 0) > 0, 30)
        for _ in range(kills):
            learner.serve(run_s)
            taken_since_commit = learner.replay.pending_rows
            learner.crash()
            uncommitted.append(taken_since_commit)
            time.sleep(down_s)  # the actor keeps stepping and spools
            _, seq = ledgered(ledger)
            learner.start()
            recoveries.append(learner.wait_durable({2: seq}))
        stop.set()
        finish(learner, actor)
    except BaseException:
        kill(actor)
        if learner.server is not None:
            learner.close()
        raise
    return record("learner_kill_restart", kills, {2: ledger}, learner, recoveries, down_s=down_s,
                  uncommitted_rows_at_crash=uncommitted)


@in_scratch_dir("chaos-partition-")
def partition(quick: bool, work: Path) -> dict:
    """Cut the actor off (a proxy drops every connection) for T seconds, N times."""
    cuts, run_s, cut_s = (1, 1.5, 2.0) if quick else (3, 3.0, 5.0)
    learner = LearnerSide(free_port(), work / "replay")
    learner.start()
    proxy_port, partitioned, ready = free_port(), CTX.Event(), CTX.Event()
    proxy = CTX.Process(target=tcp_proxy, args=(proxy_port, learner.port, partitioned, ready), daemon=True)
    proxy.start()
    ready.wait(30)
    stop = CTX.Event()
    actor = start_actor(f"tcp://127.0.0.1:{proxy_port}", work, 3, 10**9, stop, realtime=True)
    ledger = work / "ledger-3.jsonl"
    recoveries, produced_during, stored_during, rate_before, rate_during = [], [], [], [], []
    try:
        learner.serve_until(lambda: learner.taken.get(3, 0) > 0, 30)
        for _ in range(cuts):
            produced_at_start = ledgered(ledger)[0]
            learner.serve(run_s)
            rate_before.append((ledgered(ledger)[0] - produced_at_start) / run_s)
            partitioned.set()
            produced_at_cut, stored_at_cut = ledgered(ledger)[0], learner.taken.get(3, 0)
            learner.serve(cut_s)
            produced_during.append(ledgered(ledger)[0] - produced_at_cut)
            rate_during.append(produced_during[-1] / cut_s)
            stored_during.append(learner.taken.get(3, 0) - stored_at_cut)
            _, seq = ledgered(ledger)
            partitioned.clear()
            recoveries.append(learner.wait_durable({3: seq}))
        stop.set()
        finish(learner, actor)
    except BaseException:
        learner.close()
        raise
    finally:
        kill(actor, proxy)
    return record("network_partition", cuts, {3: ledger}, learner, recoveries, partition_s=cut_s,
                  rows_produced_during_partition=produced_during,
                  rows_stored_during_partition=stored_during,
                  actor_rows_per_s_before=statistics.median(rate_before),
                  actor_rows_per_s_during=statistics.median(rate_during))


HONEST = 4
ATTACKERS = {"session": ("mallory", 10), "bombs": ("bomber", 11), "flood": ("flooder", 12), "raw": (None, 0)}
"""role -> (its key's name, its actor index); the flood role also holds the ``sloth`` key (index 13)."""


def _keys(work: Path):
    """A learner key, one key per actor (authorised), and the honest actor's index bound to its key."""
    from ..hal.wire.security import ServerKeys, generate_keys

    authorized = work / "keys" / "authorized"
    authorized.mkdir(parents=True)
    server_public, server_secret = generate_keys(work / "keys", "learner")
    files = {}
    for name in ("honest", "mallory", "bomber", "flooder", "sloth"):
        public, secret = generate_keys(work / "keys" / "actors", name)
        shutil.copy(public, authorized / public.name)
        files[name] = (str(secret), str(server_public))
    (authorized / "indices.json").write_text(json.dumps({"honest": [HONEST]}))
    return ServerKeys(server_secret, authorized), files


def _refusals(server) -> dict[str, int]:
    """Messages refused so far, by reason; with two the server takes without refusing: a replayed
    batch, acknowledged and dropped (``duplicate``), and a batch past a gap in the sequence,
    taken and counted (``seq_gap``: a spool set to drop its oldest batches skips some)."""
    out = {k: v for k, v in server.stats.rejected.items() if k not in UNSENT}
    return {**out, "duplicate": server.stats.duplicates, "seq_gap": server.stats.seq_gaps}


def _honest_session(server) -> bool:
    """Whether the honest actor's index still belongs to the honest actor's link (not stolen)."""
    return all(s.name == f"chaos-{HONEST}" for s in server.sessions.values() if s.actor_id == HONEST)


def _window(learner: LearnerSide, seconds: float, attack=None) -> dict:
    """Serve ``seconds`` (attacked while ``attack`` is set). An attacked window goes on until the
    refusals stop (what attackers queued before the flag fell is part of the attack)."""
    server = learner.server
    refused0, rows0 = sum(_refusals(server).values()), learner.taken.get(HONEST, 0)
    rss0 = reset_peak_memory()
    cpu0, poll0, t0 = time.process_time(), learner.poll_cpu_s, time.monotonic()
    if attack is not None:
        attack.set()
    learner.serve(seconds)
    rows = learner.taken.get(HONEST, 0) - rows0
    if attack is not None:
        attack.clear()
        last = -1
        while last != sum(_refusals(server).values()) and time.monotonic() - t0 < seconds + 5:
            last = sum(_refusals(server).values())
            learner.serve(0.05)
    return {"wall_s": time.monotonic() - t0, "cpu_s": time.process_time() - cpu0,
            "poll_cpu_s": learner.poll_cpu_s - poll0,
            "honest_rows_per_s": rows / seconds, "refused": sum(_refusals(server).values()) - refused0,
            "peak_rss_growth_mb": own_memory_mb()[1] - rss0}


def _answer(learner: LearnerSide, pipe, timeout_s: float):
    """Serve until ``pipe`` answers; the answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pipe.poll():
            return pipe.recv()
        learner.step(timeout_ms=5)
    raise TimeoutError("an attacker did not answer")


def _probe(learner: LearnerSide, pipe, name: str, n: int) -> dict:
    """Have one attacker send ``n`` messages of one class alone: what the learner refused, by
    reason; the learner's CPU per message inside its server's poll, where every message is parsed,
    checked and refused (None for raw TCP, which ZeroMQ ends before a message exists); its peak
    RSS growth meanwhile; whether the honest actor still holds its index."""
    server = learner.server
    before, messages, rss0 = _refusals(server), server.stats.messages_in, reset_peak_memory()
    cpu0 = learner.poll_cpu_s
    pipe.send(("probe", name, n))
    _, sent = _answer(learner, pipe, 120)
    if not name.startswith("zmtp"):  # raw TCP never becomes a message
        learner.serve_until(lambda: server.stats.messages_in - messages >= sent, 5.0)
    learner.serve(0.1)
    cpu, after = learner.poll_cpu_s - cpu0, _refusals(server)
    per_message = None if name.startswith("zmtp") else round(1e6 * cpu / max(sent, 1), 1)
    return {"sent": sent, "refused": {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)},
            "cpu_us_per_message": per_message,
            "peak_rss_growth_mb": round(own_memory_mb()[1] - rss0, 1), "honest_session_kept": _honest_session(server)}


def _probe_size(name: str, quick: bool) -> int:
    if "bomb" in name:
        return 50 if quick else 100
    if name.startswith("zmtp"):
        return 5 if quick else 10
    if name == "fat_hello_flood":
        return 20 if quick else 50
    return 100 if quick else 200


@in_scratch_dir("chaos-hostile-")
def hostile(quick: bool, work: Path, pairs: int | None = None, window_s: float | None = None) -> dict:
    """Attackers in their own processes against a keyed learner while an honest keyed actor streams.

    First each attack class alone (``probes``): what the learner refused, by reason, the CPU per
    message of the thread that parses, checks and refuses it (inside the server's poll), and the
    peak RSS growth (before the honest actor dials; the claim on the honest actor's index after it). Then quiet and attacked windows alternate, every attacker at full speed in the
    attacked ones; from them, in the same run:

    * ``honest_ratio_under_attack``: the honest actor's rows taken per second, median of the
      attacked windows over median of the quiet ones;
    * ``hostile_reject_cpu_us_median``: the learner's CPU per refused message. The learner side is
      this process and nothing else runs in it, so its CPU is ``time.process_time()`` (every
      thread: the serving loop, ZeroMQ's I/O thread that decrypts and reads, the replay's
      writer). For each attacked window (with the drain after it, until refusals stop), the CPU
      beyond what a quiet window costs per second (median quiet CPU rate times the window's
      length), divided by the messages refused in it (``stats.rejected`` but ``send_failed``,
      plus replayed batches); median over the windows. Raw TCP never reaches the server's
      counters: its cost is in the numerator only;
    * ``bomb_rss_growth_mb``: the learner's peak RSS (``VmHWM``, reset before) above its RSS
      before, while decompression bombs arrive alone (the larger of the two bomb probes).

    The honest actor loses nothing: its ledger against the replay, row by row. ``pairs`` and
    ``window_s`` override the (quiet, attacked) window pairs and their length.
    """
    pairs, window_s = pairs or (2 if quick else 5), window_s or (1.0 if quick else 2.0)
    server_keys, key_files = _keys(work)
    learner = LearnerSide(free_port(), work / "replay", keys=server_keys, publish_every_s=0.5, peer_timeout_s=10.0)
    learner.start()
    go, stop_honest, attack, stop = CTX.Event(), CTX.Event(), CTX.Event(), CTX.Event()
    honest = start_actor(learner.endpoint, work, HONEST, 10**9, stop_honest, peer_timeout_s=10.0,
                         key_files=key_files["honest"], go=go)
    attackers, pipes, classes, phases, t0 = [], {}, {}, {}, time.monotonic()
    for role, (key, index) in ATTACKERS.items():
        ours, theirs = CTX.Pipe()
        keys = (key_files["flooder"], key_files["sloth"]) if role == "flood" else key_files.get(key)
        process = CTX.Process(target=chaos_hostile.attacker, daemon=True,
                              args=(role, learner.endpoint, keys, index, HONEST, attack, stop, theirs))
        process.start()
        attackers.append(process)
        pipes[role] = ours
    try:
        for role, pipe in pipes.items():
            _, names = _answer(learner, pipe, 180)
            classes.update(dict.fromkeys(names, role))
        phases["attackers_ready"] = time.monotonic() - t0
        probes = {name: _probe(learner, pipes[role], name, _probe_size(name, quick))
                  for name, role in classes.items() if name != "index_claim"}
        phases["probes"] = time.monotonic() - t0
        go.set()
        learner.serve_until(lambda: learner.taken.get(HONEST, 0) > 0, 60)
        phases["honest_streaming"] = time.monotonic() - t0
        probes["index_claim"] = _probe(learner, pipes["session"], "index_claim", _probe_size("index_claim", quick))
        rss_before, quiet, attacked = own_memory_mb()[0], [], []
        for _ in range(pairs):
            quiet.append(_window(learner, window_s))
            attacked.append(_window(learner, window_s, attack))
        rss_after = own_memory_mb()[0]
        sloth = next((x for x in learner.server.sessions.values() if x.actor_id == ATTACKERS["flood"][1] + 1), None)
        slow_reader = {"session_kept": sloth is not None,
                       "weights_resend_s": sloth.follower.resend_s if sloth is not None else None}  # backs off while it never reads
        phases["windows"] = time.monotonic() - t0
        stop.set()
        sent = {}
        for pipe in pipes.values():
            sent.update(_answer(learner, pipe, 60)[1])
        stop_honest.set()
        finish(learner, honest)
        phases["finished"] = time.monotonic() - t0
        refused = _refusals(learner.server)
        send_failed = learner.server.stats.rejected.get(SEND_FAILED, 0)
    except BaseException:
        learner.close()
        raise
    finally:
        kill(honest, *attackers)
    quiet_rows = statistics.median(w["honest_rows_per_s"] for w in quiet)
    attacked_rows = statistics.median(w["honest_rows_per_s"] for w in attacked)
    quiet_cpu = statistics.median(w["cpu_s"] / w["wall_s"] for w in quiet)
    per_refusal = [1e6 * (w["cpu_s"] - quiet_cpu * w["wall_s"]) / w["refused"] for w in attacked if w["refused"]]
    injected = sum(p["sent"] for p in probes.values()) + sum(sent.values())
    result = record("hostile_traffic", injected, {HONEST: work / f"ledger-{HONEST}.jsonl"}, learner, [],
                    rejected=sum(refused.values()), rejected_by_reason=refused, send_failed=send_failed,
                    sent_by_attack=sent, probes=probes, slow_reader=slow_reader,
                    honest_index_kept=all(p["honest_session_kept"] for p in probes.values()),
                    honest_rows_per_s_quiet=quiet_rows, honest_rows_per_s_attacked=attacked_rows,
                    honest_ratio_under_attack=attacked_rows / quiet_rows if quiet_rows else 0.0,
                    hostile_reject_cpu_us_median=statistics.median(per_refusal) if per_refusal else None,
                    learner_cpu_quiet=quiet_cpu,
                    bomb_rss_growth_mb=max(p["peak_rss_growth_mb"] for n, p in probes.items() if "bomb" in n),
                    attacked_peak_rss_growth_mb=max(w["peak_rss_growth_mb"] for w in attacked),
                    learner_rss_growth_mb=rss_after - rss_before, seconds_since_start=phases,
                    windows={"quiet": quiet, "attacked": attacked})
    result["attacker_rows_stored"] = _attacker_rows(learner.directory)
    return result


def _attacker_rows(directory) -> dict[int, int]:
    """Rows the replay holds from actors other than the honest one (each attacker with a session
    stored one valid batch of 4 rows; more is an attack that got through)."""
    return {a: len(r) for a, r in stored_rows(directory).items() if a != HONEST}


@in_scratch_dir("chaos-slow-")
def slow_learner(quick: bool, work: Path) -> dict:
    """A learner that takes 20 ms per batch: credits bound the actor; its memory and spool stay flat."""
    run_s, delay_s = (4.0, 0.02) if quick else (20.0, 0.02)
    learner = LearnerSide(free_port(), work / "replay", delay_s=delay_s)
    learner.start()
    stop = CTX.Event()
    actor = start_actor(learner.endpoint, work, 5, 10**9, stop, peer_timeout_s=10.0)
    ledger = work / "ledger-5.jsonl"
    samples = []
    try:
        learner.serve_until(lambda: learner.taken.get(5, 0) > 0, 30)
        start = time.monotonic()
        while time.monotonic() - start < run_s:
            learner.serve(0.5)
            produced, _ = ledgered(ledger)
            samples.append({"t": round(time.monotonic() - start, 2), "actor_rss_mb": rss_bytes(actor.pid) / 2**20,
                            "spool_kb": spool_bytes(work / "spool-5") / 1024,
                            "unacked_rows": produced - learner.taken.get(5, 0)})
        stop.set()
        finish(learner, actor)
    except BaseException:
        kill(actor)
        learner.close()
        raise
    half = len(samples) // 2
    rss_first = statistics.median(s["actor_rss_mb"] for s in samples[:max(1, half)])
    rss_last = statistics.median(s["actor_rss_mb"] for s in samples[half:])
    return record("slow_learner", 1, {5: ledger}, learner, [], delay_per_batch_s=delay_s,
                  max_unacked_rows=max(s["unacked_rows"] for s in samples),
                  max_spool_kb=max(s["spool_kb"] for s in samples),
                  max_learner_poll_batches=learner.max_backlog,
                  actor_rss_mb_first_half=rss_first, actor_rss_mb_second_half=rss_last,
                  rss_growth_ratio=rss_last / rss_first if rss_first else 0.0, samples=samples)
