"""``embodyrl bench replay``: the persistent replay against a plain in-RAM numpy ring.

Side by side in one run, batch 256: a robot-sized step (64-d float32 state,
7-d float32 action, reward, flags; 1M steps) and an image step (one 84x84x3
uint8 camera; 100k steps). For each: the numpy ring doing the same work
(same fields, same validity check, next observation gathered by index);
ours with all data inside its RAM budget (hot); ours with 10x more data than
its budget, after evicting the file's pages from the page cache (cold,
uniform over all stored rows; a cache-preferring mode reported apart with
its total-variation distance from uniform). Figures are medians.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import Steps
from ..replay import PersistentReplay
from ..replay.layout import row_dtype
from ..replay.sampling import draw_stored
from ..replay.staged import StagedSampler
from . import median_seconds

BATCH = 256
EPISODE = 200  # env steps per episode, then one final row
INSERT_ROWS = 1000
CHUNK_BYTES = 2 << 20
COMMIT_INTERVAL_S = 0.05  # group commits at every chunk (about 1.5 MB) or after 50 ms


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


def _batches(rows: int, obs_spec: DictSpec, act: ArraySpec):
    """The step stream as insert batches: episodes of EPISODE steps + a final row, made on the fly."""
    t = np.arange(rows, dtype=np.int64)
    for start in range(0, rows, INSERT_ROWS):
        i = t[start:start + INSERT_ROWS]
        n = len(i)
        episode, step = i // (EPISODE + 1), (i % (EPISODE + 1)).astype(np.int32)
        final = step == EPISODE
        obs = {}
        for name, spec in obs_spec.items():
            if spec.dtype == np.uint8:
                obs[name] = np.broadcast_to((i % 251).astype(np.uint8)[:, None, None, None], (n, *spec.shape)).copy()
            else:
                obs[name] = np.broadcast_to(i.astype(spec.dtype)[:, None], (n, *spec.shape)).copy()
        action = np.where(final[:, None], 0, 0.1).astype(np.float32) * np.ones((n, *act.shape), np.float32)
        yield Steps(observation=obs, action=action, proposed_action=action.copy(),
                    log_prob=np.zeros(n, np.float32), reward=(i % 7).astype(np.float32),
                    terminated=(step == EPISODE - 1) & (episode % 2 == 0),
                    truncated=(step == EPISODE - 1) & (episode % 2 == 1), final=final,
                    episode_id=episode, step_index=step, device_id=np.zeros(n, np.int32),
                    actor_id=np.zeros(n, np.int32), policy_incarnation=np.ones(n, np.int64),
                    policy_count=np.zeros(n, np.int64), source=np.zeros(n, np.uint8))


class NumpyRing:
    """The baseline: one in-RAM array per field, successor by index, same validity check."""

    def __init__(self, capacity: int, obs_spec: DictSpec, act: ArraySpec):
        self.obs = {k: np.zeros((capacity, *s.shape), s.dtype) for k, s in obs_spec.items()}
        self.action = np.zeros((capacity, *act.shape), np.float32)
        self.reward = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, bool)
        self.final = np.zeros(capacity, bool)
        self.episode = np.zeros(capacity, np.int64)
        self.step = np.zeros(capacity, np.int32)
        self.next = np.full(capacity, -1, np.int64)
        self.size = 0

    def add(self, s: Steps) -> None:
        i = np.arange(self.size, self.size + len(s))
        for k, v in self.obs.items():
            v[i] = s.observation[k]
        self.action[i], self.reward[i], self.terminated[i] = s.action, s.reward, s.terminated
        self.final[i], self.episode[i], self.step[i] = s.final, s.episode_id, s.step_index
        self.next[i] = np.where(s.final, -1, i + 1)
        self.size += len(s)

    def sample(self, rng, n: int, gamma: float) -> dict:
        idx = rng.integers(0, self.size, n + n // 4 + 8)
        nxt = self.next[idx]
        ok = ~self.final[idx] & (nxt >= 0) & (nxt < self.size)
        safe = np.where(ok, nxt, idx)
        ok &= (self.episode[safe] == self.episode[idx]) & (self.step[safe] == self.step[idx] + 1)
        keep = np.flatnonzero(ok)[:n]
        idx, nxt = idx[keep], safe[keep]
        return {"observation": {k: v[idx] for k, v in self.obs.items()}, "action": self.action[idx],
                "reward": self.reward[idx], "discount": np.where(self.terminated[idx], 0.0, gamma),
                "next_observation": {k: v[nxt] for k, v in self.obs.items()}}


def _interleaved_median_ms(baseline, ours, repeats: int) -> tuple[float, float]:
    times = np.empty((repeats, 2))
    for i in range(repeats):
        for j, fn in enumerate((baseline, ours)):
            t0 = time.perf_counter()
            fn()
            times[i, j] = time.perf_counter() - t0
    return tuple(1e3 * np.median(times, axis=0))


class DiskBaseline:
    """The disk's own durable write rate: pwrite + fdatasync in commit-sized pieces.

    Driven in step with our inserts (the same bytes, interleaved batch by
    batch), so both see the same disk, page cache and neighbours.
    """

    def __init__(self, path: Path, total: int, piece: int):
        self.path, self.piece = path, piece
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.posix_fallocate(self.fd, 0, total)
        os.fsync(self.fd)
        self.buffer = np.ones(piece, np.uint8)
        self.offset = self.pending = 0
        self.seconds = 0.0

    def write(self, nbytes: int) -> None:
        self.pending += nbytes
        while self.pending >= self.piece:
            t0 = time.perf_counter()
            os.pwrite(self.fd, self.buffer, self.offset)
            os.fdatasync(self.fd)
            self.seconds += time.perf_counter() - t0
            self.offset += self.piece
            self.pending -= self.piece

    def close(self) -> float:
        """Bytes/s over the whole pieces written."""
        os.close(self.fd)
        self.path.unlink()
        return self.offset / self.seconds


QUEUE_DEPTHS = (1, 4, 16, 32)


def _disk_random_reads(path: Path, read_bytes: int, batches: int) -> dict:
    """The disk's own cold random-read speed on ``path``: BATCH reads of ``read_bytes``
    (a row and its successor, whole pages) at random page-aligned offsets, page cache
    dropped before each batch, issued by ``depth`` threads (``pread``, the GIL released)
    and, apart, all hinted to the kernel at once (``POSIX_FADV_WILLNEED``), as the replay does.
    Median ms per batch: the ceiling of any i.i.d. sampler over cold rows."""
    page = os.sysconf("SC_PAGE_SIZE")
    read_bytes = -(-read_bytes // page) * page
    fd = os.open(path, os.O_RDONLY)
    rng = np.random.default_rng(1)
    pages = (os.fstat(fd).st_size - read_bytes) // page
    out = {}
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for depth in (*QUEUE_DEPTHS, "hinted"):
            pool = ThreadPoolExecutor(depth) if depth != "hinted" else None
            times = []
            for _ in range(batches):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                offsets = (rng.integers(0, pages, BATCH) * page).tolist()
                t0 = time.perf_counter()
                if pool is None:
                    for o in offsets:
                        os.posix_fadvise(fd, o, read_bytes, os.POSIX_FADV_WILLNEED)
                    for o in offsets:
                        os.pread(fd, read_bytes, o)
                else:
                    list(pool.map(lambda part: [os.pread(fd, read_bytes, o) for o in part],
                                  [offsets[i::depth] for i in range(depth)]))
                times.append(time.perf_counter() - t0)
            if pool is not None:
                pool.shutdown()
            ms = 1e3 * float(np.median(times))
            key = f"qd{depth}" if depth != "hinted" else "hinted"
            out[f"disk_random_read_batch_ms_{key}"] = ms
            out[f"disk_random_read_iops_{key}"] = BATCH / ms * 1e3
    finally:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    out["disk_random_read_bytes"] = read_bytes
    return out


def _wrapping(root: Path, obs_spec: DictSpec, act: ArraySpec, chunk_rows: int) -> dict:
    """A full ring going round 3 times with background commits, as a long run's learner sees it:
    how often ``add`` waited for an eviction's commit, and its time per batch with ``maybe_commit``."""
    chunks = max(16, -(-4 * INSERT_ROWS // chunk_rows))  # a batch never spans a quarter of the ring
    replay = PersistentReplay(root / "wrapping", obs_spec, act, capacity=chunks * chunk_rows,
                              chunk_rows=chunk_rows, ram_budget_bytes=1 << 40)
    times = []
    for steps in _batches(4 * chunks * chunk_rows, obs_spec, act):
        t0 = time.perf_counter()
        replay.add(steps, seq=0)
        replay.maybe_commit(COMMIT_INTERVAL_S)
        times.append(time.perf_counter() - t0)
    waits = replay.store.eviction_waits
    replay.close()
    shutil.rmtree(root / "wrapping")
    return {"wrap_chunk_boundaries_evicting": 3 * chunks, "wrap_eviction_waits": waits,
            "wrap_insert_batch_ms_p50": 1e3 * float(np.median(times)),
            "wrap_insert_batch_ms_p99": 1e3 * float(np.percentile(times, 99))}


def _chunk_tv(counts: np.ndarray, fill: np.ndarray) -> float:
    p = counts / counts.sum()
    q = fill / fill.sum()
    return float(0.5 * np.abs(p - q).sum())


def _staged_uniformity(replay, staged, rng, batches: int) -> dict:
    """How the staged draw differs from i.i.d. uniform, over the same number of draws.

    Chunk-level total variation from uniform of the empirical draws (finite
    samples make even the i.i.d. draw's TV positive: its value is the
    yardstick), and distinct chunks per batch (i.i.d. batches span many more).
    """
    ring = replay.store.ring
    fill = ring.fill.astype(np.float64)
    staged_counts = np.zeros(ring.chunks)
    iid_counts = np.zeros(ring.chunks)
    staged_distinct, iid_distinct = [], []
    for _ in range(batches):
        idx, _ = staged.sample_indices(rng, BATCH)
        chunks = idx // ring.chunk_rows
        np.add.at(staged_counts, chunks, 1)
        staged_distinct.append(len(np.unique(chunks)))
        iid = draw_stored(rng, ring, BATCH) // ring.chunk_rows
        np.add.at(iid_counts, iid, 1)
        iid_distinct.append(len(np.unique(iid)))
    return {"cold_staged_chunk_tv_from_uniform": _chunk_tv(staged_counts, fill),
            "iid_chunk_tv_from_uniform_same_draws": _chunk_tv(iid_counts, fill),
            "cold_staged_distinct_chunks_per_batch": float(np.median(staged_distinct)),
            "iid_distinct_chunks_per_batch": float(np.median(iid_distinct)),
            "cold_staged_pool_chunks": staged.pool_chunks, "stored_chunks": int((fill > 0).sum()),
            "uniformity_batches": batches}


def _case(name: str, rows: int, obs_spec: DictSpec, act: ArraySpec, root: Path, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    row_bytes = row_dtype(obs_spec, act).itemsize
    chunk_rows = 1 << max(4, int(np.log2(CHUNK_BYTES // row_bytes)))  # about 1-2 MB per chunk
    chunk_rows = min(chunk_rows, max(16, rows // 16))
    capacity = -(-rows // chunk_rows) * chunk_rows + chunk_rows
    directory = root / name
    # -- ours: create and fill, in budget (anonymous memory measured before anything else is held)
    disk = DiskBaseline(root / "disk.bin", rows * row_bytes, chunk_rows * row_bytes)
    anon_before = _rss_anon()
    data_bytes = rows * row_bytes
    budget = int(data_bytes * 1.5)
    replay = PersistentReplay(directory, obs_spec, act, capacity=capacity, chunk_rows=chunk_rows,
                              ram_budget_bytes=budget)
    fill_s = 0.0  # the replay's own time: making the synthetic batches is not counted
    commit_calls = []  # the learner thread's time in maybe_commit (syncs run in the background)
    for steps in _batches(rows, obs_spec, act):
        t0 = time.perf_counter()
        replay.add(steps, seq=0)
        t1 = time.perf_counter()
        replay.maybe_commit(COMMIT_INTERVAL_S)
        t2 = time.perf_counter()
        commit_calls.append(t2 - t1)
        fill_s += t2 - t0
        disk.write(len(steps) * row_bytes)
    t0 = time.perf_counter()
    replay.commit()
    fill_s += time.perf_counter() - t0
    disk_bps = disk.close()
    wrapping = _wrapping(root, obs_spec, act, chunk_rows)
    anon_growth = _rss_anon() - anon_before
    inserts_per_s = rows / fill_s
    committed_bps = data_bytes / fill_s
    ring = NumpyRing(rows, obs_spec, act)
    numpy_s = 0.0
    for steps in _batches(rows, obs_spec, act):
        t0 = time.perf_counter()
        ring.add(steps)
        numpy_s += time.perf_counter() - t0
    numpy_inserts_per_s = rows / numpy_s
    # the baseline and ours alternate batch by batch, so both see the same machine
    numpy_ms, hot_ms = _interleaved_median_ms(lambda: ring.sample(rng, BATCH, 0.99),
                                              lambda: replay.sample(rng, BATCH, 0.99), repeats)
    ring = None  # free the baseline before the cold phase
    replay.close()
    t0 = time.perf_counter()
    replay = PersistentReplay(directory, ram_budget_bytes=data_bytes // 10)
    reopen_s = time.perf_counter() - t0
    # -- ours with 10x more data than its budget, cold
    replay.drop_page_cache()
    read0 = _read_bytes()
    t0 = time.perf_counter()
    replay.sample(rng, BATCH, 0.99)
    first_cold_ms = 1e3 * (time.perf_counter() - t0)
    cold_ms = 1e3 * median_seconds(lambda: replay.sample(rng, BATCH, 0.99), repeats)
    cold_read = (_read_bytes() - read0) / (repeats + 1)
    firsts = []  # the first batch after the page cache is dropped, again and again
    for _ in range(max(3, repeats // 20)):
        replay.drop_page_cache()
        t0 = time.perf_counter()
        replay.sample(rng, BATCH, 0.99)
        firsts.append(1e3 * (time.perf_counter() - t0))
    replay.drop_page_cache()
    disk_reads = _disk_random_reads(directory / "data.bin", 2 * row_bytes, max(5, repeats // 10))
    best_disk_ms = min(v for k, v in disk_reads.items() if k.startswith("disk_random_read_batch_ms_"))
    # chunks then rows from a resident pool (staged.py): marginally uniform, batches correlated
    replay.drop_page_cache()
    staged = StagedSampler(replay, max(1, replay.cache.budget_chunks - 2), turnover_every=8)
    t0 = time.perf_counter()
    staged.warm_up(rng)  # once per start: the pool read sequentially
    staged_warm_up_s = time.perf_counter() - t0
    read0 = _read_bytes()
    t0 = time.perf_counter()
    staged_ms = 1e3 * median_seconds(lambda: staged.sample(rng, BATCH, 0.99), repeats)
    staged_mean_ms = 1e3 * (time.perf_counter() - t0) / repeats
    staged_read = (_read_bytes() - read0) / repeats
    uniformity = _staged_uniformity(replay, staged, rng, 20 * repeats)
    staged.close()
    replay.drop_page_cache()
    hot_weight = 10.0
    preferring_ms = 1e3 * median_seconds(lambda: replay.sample(rng, BATCH, 0.99, hot_weight=hot_weight), repeats)
    tv = replay.cache.tv_from_uniform(hot_weight)
    replay.close()
    shutil.rmtree(directory)
    return {
        "rows": rows, "row_bytes": data_bytes // rows, "batch": BATCH,
        "numpy_sample_ms": numpy_ms, "hot_sample_ms": hot_ms, "cold_sample_ms": cold_ms,
        "hot_sample_ratio_vs_numpy": numpy_ms / hot_ms, "cold_sample_ratio_vs_numpy": numpy_ms / cold_ms,
        "first_cold_batch_ms": first_cold_ms, "first_cold_batch_ms_median": float(np.median(firsts)),
        "first_cold_batch_repeats": len(firsts), "cold_bytes_read_per_batch": cold_read, **disk_reads,
        "cold_ceiling_ratio_vs_numpy": numpy_ms / best_disk_ms,
        "cold_staged_warm_up_s": staged_warm_up_s, "cold_staged_sample_ms": staged_ms,
        "cold_staged_mean_sample_ms": staged_mean_ms,
        "cold_staged_sample_ratio_vs_numpy": numpy_ms / staged_ms,
        "cold_staged_mean_ratio_vs_numpy": numpy_ms / staged_mean_ms,
        "cold_staged_bytes_read_per_batch": staged_read, **uniformity,
        "cache_preferring_sample_ms": preferring_ms, "cache_preferring_hot_weight": hot_weight,
        "cache_preferring_tv_from_uniform": tv,
        "reopen_s": reopen_s, "inserts_per_s": inserts_per_s, "numpy_inserts_per_s": numpy_inserts_per_s,
        "committed_bytes_per_s": committed_bps, "disk_write_fdatasync_bytes_per_s": disk_bps,
        "durable_write_ratio_vs_disk": committed_bps / disk_bps,
        "maybe_commit_median_us": 1e6 * float(np.median(commit_calls)),
        "maybe_commit_max_ms": 1e3 * float(np.max(commit_calls)), **wrapping,
        "rss_anon_growth_bytes": anon_growth, "ram_budget_bytes": budget,
        "rss_anon_over_budget_ratio": anon_growth / budget,
    }


def run(quick: bool = False) -> dict:
    robot_rows, image_rows, repeats = (20_000, 4_000, 20) if quick else (1_000_000, 100_000, 200)
    act = ArraySpec("action", (7,), np.float32, -1, 1)
    root = Path(tempfile.mkdtemp(prefix="embodyrl-bench-replay-", dir=os.environ.get("EMBODYRL_BENCH_DIR")))
    try:
        robot = _case("robot", robot_rows, DictSpec.of(ArraySpec("state", (64,), np.float32)), act, root, repeats)
        image = _case("image", image_rows, DictSpec.of(ArraySpec("camera", (84, 84, 3), np.uint8)), act, root,
                      repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {f"image_{k}": v for k, v in image.items()}
    out.update(robot)  # the key names refer to the robot case; the image case is prefixed
    out["quick"] = quick
    return out
