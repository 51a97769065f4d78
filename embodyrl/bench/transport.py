"""``embodyrl bench transport``: our wire against raw pyzmq and pickle-over-ZeroMQ.

Side by side, in one run, on loopback:

* ``large_batch_ratio_vs_raw``: image-sized batches (128 steps of an 84x84x3
  camera, ~2.7 MB) from a sender process through the real actor-side link
  (encode, spool, credits: a window of 16 batches) into the real server ingest (decode, validate
  against the specs) and the replay's append (page cache; no commit), over
  raw pyzmq moving the same frames DEALER -> ROUTER. The replay is in its
  steady state (its file written once, as through most of a long run);
  ``large_batch_ratio_vs_raw_first_fill`` is the same into a fresh file,
  whose every page the kernel must first allocate.
* ``transitions_per_s_4_actors``: four actor processes push pre-built
  batches of 256 HalfCheetah-sized steps (17-dim observation, 6-dim action)
  through their links to the real :class:`~embodyrl.learner.Learner`
  (training off), which acknowledges each batch after the replay's group
  commit (fdatasync): steps per second made durable.
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
    version = PolicyVersion(1, 1)
    for _ in range(rows):
        obs = {k: rng.integers(0, 255, s.shape, dtype=np.uint8) if s.dtype == np.uint8
               else rng.normal(size=s.shape).astype(s.dtype) for k, s in obs_spec.items()}
        a = rng.uniform(-1, 1, action_spec.shape).astype(np.float32)
        rec.add(obs, a, a, float(rng.normal()), False, False, version)
    return rec.flush()


# -- sender processes (spawned) ------------------------------------------
def _raw_sender(endpoint: str, batches: int, mode: str) -> None:
    steps = _batch(IMAGE_SPEC, IMAGE_ACTION, 128, 0, 0)
    arrays = steps.arrays()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 4)
    sock.connect(endpoint)
    if mode == "raw":
        from ..hal.wire.codec import encode

        frames = encode(P.STEPS, {}, arrays)
        for _ in range(batches):
            sock.send_multipart(frames, copy=False)
    else:  # pickle, as many RL transports do
        for _ in range(batches):
            sock.send(pickle.dumps(arrays, protocol=pickle.HIGHEST_PROTOCOL), copy=False)
    sock.send(b"end")
    sock.close(linger=-1)
    ctx.term()


def _link_sender(endpoint: str, batches: int, obs_msg, action_msg, rows: int, actor_id: int) -> None:
    from ..hal.wire.client import LearnerLink

    obs_spec, action_spec = DictSpec.from_msg(obs_msg), ArraySpec.from_msg(action_msg)
    steps = _batch(obs_spec, action_spec, rows, actor_id, actor_id)
    info = P.DeviceInfo(0, "bench", obs_spec, action_spec)
    link = LearnerLink(endpoint, actor_name=f"bench-{actor_id}", actor_id=actor_id, devices=[info],
                       handshake_timeout_s=60, compression="off")
    link.connect()
    for _ in range(batches):
        while link.credits < rows:
            link.poll(1)
        link.send_steps(0, steps)
        link.poll(0)
    link.flush(120)
    link.close()


# -- measurements --------------------------------------------------------
def _receive_raw(batches: int, mode: str) -> float:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    proc = mp.get_context("spawn").Process(target=_raw_sender, args=(f"tcp://127.0.0.1:{port}", batches, mode))
    proc.start()
    if mode == "pickle":  # the receiver's work, made from a local twin of the payload (see above)
        local = _batch(IMAGE_SPEC, IMAGE_ACTION, 128, 0, 0).arrays()
        twin = pickle.dumps(local, protocol=pickle.HIGHEST_PROTOCOL)
        ring = {k: np.zeros((8192, *v.shape[1:]), v.dtype) for k, v in local.items()}
        cursor = 0
    nbytes, start = 0, None
    while True:
        frames = sock.recv_multipart(copy=False)
        if start is None:
            start = time.perf_counter()
        if frames[1].bytes == b"end":
            break
        nbytes += sum(len(f) for f in frames[1:])
        if mode == "pickle":
            arrays = pickle.loads(twin)
            n = len(arrays["reward"])
            for k, v in arrays.items():
                ring[k][cursor:cursor + n] = v
            cursor = (cursor + n) % (8192 - n)
    elapsed = time.perf_counter() - start
    proc.join(30)
    sock.close(0)
    ctx.term()
    return nbytes / elapsed


def _receive_ours(batches: int, directory: Path, first_fill: bool = False) -> float:
    """Bytes/s through our link and ingest into the replay; in its steady state (the data file
    written once, as through most of a long run) unless ``first_fill``."""
    from ..replay.persistent import PersistentReplay
    from ..transport import LearnerServer

    # room for every batch: no eviction, whose durable commit is not part of this figure
    capacity = (batches * 128 // 1024 + 1) * 1024
    replay = PersistentReplay(directory, IMAGE_SPEC, IMAGE_ACTION, capacity=capacity, chunk_rows=1024,
                              ram_budget_bytes=64 << 20)
    if not first_fill:  # the file's pages exist, as after the first pass of any long run
        fd = os.open(directory / DATA_FILE, os.O_WRONLY)
        zeros = bytes(64 << 20)
        for offset in range(0, capacity * replay.store.row_bytes, len(zeros)):
            os.pwrite(fd, zeros, offset)
        os.close(fd)
    server = LearnerServer(run_id="bench", incarnation=1)
    proc = mp.get_context("spawn").Process(
        target=_link_sender, args=(server.endpoint, batches, IMAGE_SPEC.to_msg(), IMAGE_ACTION.to_msg(), 128, 0))
    proc.start()
    received, nbytes, start = 0, 0, None
    granted = False
    while received < batches:
        for b in server.poll(50):
            if start is None:
                start = time.perf_counter()
            replay.add(b.steps, seq=b.seq)
            nbytes += sum(a.nbytes for a in b.steps.arrays().values())
            received += 1
            server.ack(b.session, b.seq, credits=len(b.steps))
        if not granted and server.sessions:
            server.grant(next(iter(server.sessions.values())), 16 * 128)
            granted = True
        if not proc.is_alive() and received < batches:
            raise RuntimeError("sender died")
    elapsed = time.perf_counter() - start
    deadline = time.monotonic() + 30
    while proc.is_alive() and time.monotonic() < deadline:
        server.poll(20)
    proc.join(5)
    server.close()
    replay.close(commit=False)
    return nbytes / elapsed


def _four_actors(batches: int, directory: Path) -> float:
    from ..config import LearnerConfig, TrainConfig
    from ..learner import Learner

    actors, rows = 4, 256
    lc = LearnerConfig(min_replay=10**12, replay_capacity=1 << 21, replay_chunk_rows=8192,
                       credit_quantum=32 * rows, rate_tolerance=64 * rows, log_every_s=1e9)
    config = TrainConfig(task="bench", steps=actors * batches * rows, learner=lc)
    learner = Learner(config, CHEETAH_SPEC, CHEETAH_ACTION, directory)
    first = []
    ingest = learner._ingest

    def timed_ingest(batch):
        if not first:
            first.append(time.perf_counter())
        ingest(batch)

    learner._ingest = timed_ingest
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_link_sender, args=(learner.endpoint, batches, CHEETAH_SPEC.to_msg(),
                                                    CHEETAH_ACTION.to_msg(), rows, i)) for i in range(actors)]
    for p in procs:
        p.start()
    learner.run()
    elapsed = time.perf_counter() - first[0]
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    committed = learner.replay.rows_added if hasattr(learner.replay, "rows_added") else learner.counters.rows
    return committed / elapsed


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
    raw, ours, first, pickled = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            raw.append(_receive_raw(large_batches, "raw"))
            ours.append(_receive_ours(large_batches, Path(tmp) / f"large{i}"))
            first.append(_receive_ours(large_batches, Path(tmp) / f"first{i}", first_fill=True))
            pickled.append(_receive_raw(large_batches, "pickle"))
        durable = _four_actors(actor_batches, Path(tmp) / "four")
    raw_bps, ours_bps, first_bps, pickle_bps = (statistics.median(x) for x in (raw, ours, first, pickled))
    return {
        "large_batch_mb_per_s": round(ours_bps / 1e6, 1),
        "raw_pyzmq_mb_per_s": round(raw_bps / 1e6, 1),
        "pickle_zmq_mb_per_s": round(pickle_bps / 1e6, 1),
        "large_batch_ratio_vs_raw": round(ours_bps / raw_bps, 3),
        "large_batch_ratio_vs_raw_first_fill": round(first_bps / raw_bps, 3),
        "speedup_vs_pickle": round(ours_bps / pickle_bps, 2),
        "transitions_per_s_4_actors": round(durable),
        "sparse_1pct_size_ratio": round(_sparse_ratio(), 1),
        "repeats": repeats,
    }



