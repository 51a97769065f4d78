"""``embodyrl bench transport``: our wire against raw pyzmq and pickle-over-ZeroMQ.

Side by side, in one run, on loopback:

* ``large_batch_ratio_vs_raw``: image-sized batches (128 steps of an 84x84x3
  camera, ~2.7 MB) from a sender process through the real actor-side link
  (encode, spool, credits: a window of 16 batches) into the real server ingest (decode, validate
  against the specs) and the replay's append (page cache; no commit; the
  clock stops once the writer thread has written the last batch), over
  raw pyzmq moving the same frames DEALER -> ROUTER. The replay is in its
  steady state (its file written once and synced, as through most of a long
  run); ``large_batch_ratio_vs_raw_first_fill`` is the same into a fresh
  file, whose every page the kernel must first allocate, and
  ``large_batch_ratio_vs_raw_inline_writes`` the same with every write on
  the ingest thread. ``large_batch_receiver_cpu_ms``,
  ``raw_receiver_cpu_ms``, ``large_batch_sender_cpu_ms`` and
  ``raw_sender_cpu_ms``: CPU seconds per batch of the receiving and the
  sending process (all their threads, ZeroMQ's included), ours and raw.
* ``transitions_per_s_4_actors``: four actor processes push pre-built
  batches of 256 HalfCheetah-sized steps (17-dim observation, 6-dim action)
  through their links to the real :class:`~embodyrl.learner.LearnerService`
  (training off), which acknowledges each batch after the replay's group
  commit (fdatasync): steps per second made durable, from the first batch
  ingested to the ack that covers the last row (credits go out once all
  four are connected). ``learner_cpu_ms_per_batch`` and
  ``sender_cpu_ms_per_batch`` (the four together) are CPU seconds per batch
  over that run, and ``cores_for_1m_rows_per_s`` what 3,906 batches/s would
  take at those costs.
* ``sparse_1pct_size_ratio``: full weights over a bit-exact delta at 1%
  density (a 1M-parameter policy).
* ``speedup_vs_pickle``: our large-batch throughput over what many RL
  transports do: pickled dicts of the same arrays over ZeroMQ, unpickled and
  copied into an in-RAM numpy ring at the receiver. We never unpickle bytes
  that came over a socket, even here: the baseline's receiver is charged
  for unpickling an identical payload it pickled itself before the run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import PolicyVersion, StepRecorder
from ..hal.wire import protocol as P
from ..hal.wire import weights as W
from ..replay.layout import DATA_FILE

IMAGE_SPEC = DictSpec.of(ArraySpec("camera", (84, 84, 3), np.uint8, 0, 255))
CHEETAH_SPEC = DictSpec.of(ArraySpec("state", (17,), np.float32))
IMAGE_ACTION = ArraySpec("action", (2,), np.float32, -1, 1)
CHEETAH_ACTION = ArraySpec("action", (6,), np.float32, -1, 1)


def _batch(obs_spec: DictSpec, action_spec: ArraySpec, rows: int, actor_id: int, seed: int):
    rng = np.random.default_rng(seed)
    rec = StepRecorder(obs_spec, action_spec, actor_id=actor_id, device_id=0, capacity=rows)
    version = PolicyVersion(7, 1)  # an earlier learner's: the receiving servers are incarnation 1
    for _ in range(rows):
        obs = {k: rng.integers(0, 255, s.shape, dtype=np.uint8) if s.dtype == np.uint8
               else rng.normal(size=s.shape).astype(s.dtype) for k, s in obs_spec.items()}
        a = rng.uniform(-1, 1, action_spec.shape).astype(np.float32)
        rec.add(obs, a, a, float(rng.normal()), False, False, version)
    return rec.flush()


# -- sender processes (spawned) ------------------------------------------
def _raw_sender(endpoint: str, batches: int, mode: str, report) -> None:
    """Send ``batches`` raw (or pickled) image batches; put the CPU seconds of sending on ``report``."""
    steps = _batch(IMAGE_SPEC, IMAGE_ACTION, 128, 0, 0)
    arrays = steps.arrays()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 4)
    sock.connect(endpoint)
    cpu = time.process_time()
    if mode == "raw":
        from ..hal.wire.codec import encode

        frames = encode(P.STEPS, {}, arrays)
        for _ in range(batches):
            sock.send_multipart(frames, copy=False)
    else:  # pickle, as many RL transports do
        for _ in range(batches):
            sock.send(pickle.dumps(arrays, protocol=pickle.HIGHEST_PROTOCOL), copy=False)
    sock.send(b"end")
    sock.close(linger=-1)  # waits until every frame is out
    ctx.term()
    report.put(time.process_time() - cpu)


def _link_sender(endpoint: str, batches: int, obs_msg, action_msg, rows: int, actor_id: int,
                 report=None) -> None:
    """Push ``batches`` copies of one pre-built batch as credits allow; put the process's CPU
    seconds (every thread) from the handshake to the last ack on ``report``, if given."""
    from ..hal.wire.client import LearnerLink

    obs_spec, action_spec = DictSpec.from_msg(obs_msg), ArraySpec.from_msg(action_msg)
    steps = _batch(obs_spec, action_spec, rows, actor_id, actor_id)
    info = P.DeviceInfo(0, "bench", obs_spec, action_spec)
    link = LearnerLink(endpoint, actor_name=f"bench-{actor_id}", actor_id=actor_id, devices=[info],
                       handshake_timeout_s=60, compression="off")
    link.connect()
    cpu = time.process_time()
    for _ in range(batches):
        while link.credits < rows:
            link.poll(1)
        link.send_steps(0, steps)
        link.poll(0)
    link.flush(120)
    if report is not None:
        report.put(time.process_time() - cpu)
    link.close()


# -- measurements --------------------------------------------------------
def _receive_raw(batches: int, mode: str) -> tuple[float, float, float]:
    """(bytes/s, receiver and sender CPU seconds per batch, every thread of each process)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    report = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_raw_sender, args=(f"tcp://127.0.0.1:{port}", batches, mode,
                                                                     report))
    proc.start()
    if mode == "pickle":  # the receiver's work, made from a local twin of the payload (see above)
        local = _batch(IMAGE_SPEC, IMAGE_ACTION, 128, 0, 0).arrays()
        twin = pickle.dumps(local, protocol=pickle.HIGHEST_PROTOCOL)
        ring = {k: np.zeros((8192, *v.shape[1:]), v.dtype) for k, v in local.items()}
        cursor = 0
    nbytes, start, cpu = 0, None, 0.0
    while True:
        frames = sock.recv_multipart(copy=False)
        if start is None:
            start, cpu = time.perf_counter(), time.process_time()
        if frames[1].bytes == b"end":
            break
        nbytes += sum(len(f) for f in frames[1:])
        if mode == "pickle":
            arrays = pickle.loads(twin)
            n = len(arrays["reward"])
            for k, v in arrays.items():
                ring[k][cursor:cursor + n] = v
            cursor = (cursor + n) % (8192 - n)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    sender_cpu = report.get(timeout=60)
    proc.join(30)
    sock.close(0)
    ctx.term()
    return nbytes / elapsed, cpu / batches, sender_cpu / batches


def _receive_ours(batches: int, directory: Path, first_fill: bool = False,
                  write_behind: bool = True) -> tuple[float, float, float]:
    """(bytes/s, receiver and sender CPU s per batch) through our link and ingest into the replay; in its
    steady state (the data file written once and synced, as through most of a long run) unless
    ``first_fill``. The clock stops once the last batch is in the page cache (with
    ``write_behind``, the writer thread's queue drained)."""
    from ..replay.persistent import PersistentReplay
    from ..transport import LearnerServer

    # room for every batch: no eviction, whose durable commit is not part of this figure
    capacity = (batches * 128 // 1024 + 1) * 1024
    replay = PersistentReplay(directory, IMAGE_SPEC, IMAGE_ACTION, capacity=capacity, chunk_rows=1024,
                              ram_budget_bytes=64 << 20, write_behind_bytes=256 << 10 if write_behind else None)
    if not first_fill:  # the file's pages exist and are clean, as after the first pass of a long
        fd = os.open(directory / DATA_FILE, os.O_WRONLY)  # run, whose group commits sync them
        zeros = bytes(64 << 20)
        for offset in range(0, capacity * replay.store.row_bytes, len(zeros)):
            os.pwrite(fd, zeros, offset)
        os.fsync(fd)  # else the kernel writes these back during the run, stalling its writes
        os.close(fd)
    server = LearnerServer(run_id="bench", incarnation=1)
    report = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_link_sender, args=(
        server.endpoint, batches, IMAGE_SPEC.to_msg(), IMAGE_ACTION.to_msg(), 128, 0, report))
    proc.start()
    received, nbytes, start, cpu = 0, 0, None, 0.0
    granted = False
    while received < batches:
        for b in server.poll(50):
            if start is None:
                start, cpu = time.perf_counter(), time.process_time()
            replay.add(b.steps, seq=b.seq)
            nbytes += sum(a.nbytes for a in b.steps.arrays().values())
            received += 1
            server.ack(b.session, b.seq, credits=len(b.steps))
        if not granted and server.sessions:
            server.grant(next(iter(server.sessions.values())), 16 * 128)
            granted = True
        if not proc.is_alive() and received < batches:
            raise RuntimeError("sender died")
    replay.wait_for_writes()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    deadline = time.monotonic() + 30
    while proc.is_alive() and time.monotonic() < deadline:
        server.poll(20)
    sender_cpu = report.get(timeout=60)
    proc.join(5)
    server.close()
    replay.close(commit=False)
    return nbytes / elapsed, cpu / batches, sender_cpu / batches


def _four_actors(batches: int, directory: Path) -> tuple[float, float, float]:
    """(rows/s made durable and acknowledged, learner CPU s per batch, sender CPU s per batch).

    The clock runs from the first batch ingested to the ack of the commit
    that holds the last row; credits go out once all four actors are
    connected, so no actor's start-up (spawn, imports) dilutes the rate.
    """
    from ..config import LearnerConfig, TrainConfig
    from ..hal.layout import Layout
    from ..learner import build_learner

    actors, rows = 4, 256
    lc = LearnerConfig(min_replay=10**12, replay_capacity=1 << 21, replay_chunk_rows=8192,
                       credit_quantum=32 * rows, rate_tolerance=64 * rows, log_every_s=1e9)
    config = TrainConfig(task="bench", steps=actors * batches * rows, learner=lc)
    learner = build_learner(config, Layout.of("bench", CHEETAH_SPEC, CHEETAH_ACTION), directory)
    data, server = learner.data, learner.server
    marks: dict[str, float] = {}
    acked: dict[int, int] = {}
    add, ack, grant = data.add, server.ack, data.grant_credits

    def timed_add(steps, seq, actor_id):
        if not marks:
            marks.update(start=time.perf_counter(), cpu=time.process_time())
        return add(steps, seq, actor_id)

    def timed_ack(session, seq, credits=0):
        ack(session, seq, credits)
        acked[session.actor_id] = seq
        if "end" not in marks and len(acked) == actors and min(acked.values()) == batches:
            marks.update(end=time.perf_counter(), cpu=time.process_time() - marks["cpu"])

    def grant_once_all_connected(server):
        if marks or len(server.sessions) == actors:
            grant(server)

    data.add, server.ack, data.grant_credits = timed_add, timed_ack, grant_once_all_connected
    ctx = mp.get_context("spawn")
    report = ctx.Queue()
    procs = [ctx.Process(target=_link_sender, args=(learner.endpoint, batches, CHEETAH_SPEC.to_msg(),
                                                    CHEETAH_ACTION.to_msg(), rows, i, report)) for i in range(actors)]
    for p in procs:
        p.start()
    learner.run()
    sender_cpu = sum(report.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    total = actors * batches
    return data.replay.rows_added / (marks["end"] - marks["start"]), marks["cpu"] / total, sender_cpu / total


def _sparse_ratio() -> float:
    rng = np.random.default_rng(0)
    base = {"w": rng.normal(size=(1000, 1000)).astype(np.float32)}
    new = {"w": base["w"].copy()}
    flat = new["w"].reshape(-1)
    idx = rng.choice(flat.size, flat.size // 100, replace=False)
    flat[idx] += np.float32(1e-3)
    delta = W.encode_delta(base, new)
    assert W.checksum(W.apply_delta(base, delta)) == W.checksum(new)
    return W.nbytes(new) / W.nbytes(delta)


def run(quick: bool = False) -> dict:
    large_batches = 20 if quick else 200
    actor_batches = 20 if quick else 400
    repeats = 1 if quick else 3
    raw, ours, inline, first, pickled, durable = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            raw.append(_receive_raw(large_batches, "raw"))
            ours.append(_receive_ours(large_batches, Path(tmp) / f"large{i}"))
            inline.append(_receive_ours(large_batches, Path(tmp) / f"inline{i}", write_behind=False))
            first.append(_receive_ours(large_batches, Path(tmp) / f"first{i}", first_fill=True))
            pickled.append(_receive_raw(large_batches, "pickle"))
        for i in range(1 if quick else 2):
            durable.append(_four_actors(actor_batches, Path(tmp) / f"four{i}"))

    def median(runs, k=0):
        return statistics.median(r[k] for r in runs)

    raw_bps, ours_bps, first_bps, pickle_bps = (median(x) for x in (raw, ours, first, pickled))
    learner_cpu, sender_cpu = median(durable, 1), median(durable, 2)
    return {
        "large_batch_mb_per_s": round(ours_bps / 1e6, 1),
        "raw_pyzmq_mb_per_s": round(raw_bps / 1e6, 1),
        "pickle_zmq_mb_per_s": round(pickle_bps / 1e6, 1),
        "large_batch_ratio_vs_raw": round(ours_bps / raw_bps, 3),
        "large_batch_ratio_vs_raw_first_fill": round(first_bps / raw_bps, 3),
        # the same with every write on the ingest thread (no write-behind): what the writer thread buys
        "large_batch_ratio_vs_raw_inline_writes": round(median(inline) / raw_bps, 3),
        "speedup_vs_pickle": round(ours_bps / pickle_bps, 2),
        # CPU seconds per 2.7 MB batch in the receiving process (all its threads), ours vs raw
        "large_batch_receiver_cpu_ms": round(1e3 * median(ours, 1), 3),
        "raw_receiver_cpu_ms": round(1e3 * median(raw, 1), 3),
        "large_batch_sender_cpu_ms": round(1e3 * median(ours, 2), 3),
        "raw_sender_cpu_ms": round(1e3 * median(raw, 2), 3),
        "transitions_per_s_4_actors": round(median(durable)),
        # CPU seconds per 256-row batch: the learner process, and the four senders together
        "learner_cpu_ms_per_batch": round(1e3 * learner_cpu, 3),
        "sender_cpu_ms_per_batch": round(1e3 * sender_cpu, 3),
        # cores that 1 M rows/s (3,906 batches/s) takes at those costs
        "cores_for_1m_rows_per_s": round((learner_cpu + sender_cpu) * 1e6 / 256, 2),
        "sparse_1pct_size_ratio": round(_sparse_ratio(), 1),
        "repeats": repeats,
    }
