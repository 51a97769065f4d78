"""Chunks then rows: fast sampling when the buffer is many times larger than its RAM budget.

Experimental: no learner or config setting uses it yet; ``embodyrl bench replay``
measures it against uniform sampling. A learner would sample through it in
place of :meth:`~embodyrl.replay.PersistentReplay.sample` once its correlation
within batches (below) is shown not to hurt learning.

I.i.d. uniform rows from a cold buffer cost one random page read each (about
3-15 ms per batch of 256 here, whatever the hints), so the disk's random-read
rate, not the code, bounds them. This sampler instead keeps a *pool* of whole
chunks resident (read sequentially, ahead of time, with ``POSIX_FADV_WILLNEED``)
and draws each batch's rows i.i.d. uniformly from the pool's rows. Every
``turnover_every`` batches one stored chunk, chosen uniformly among those not pooled, is
read in by a loader thread (one sequential ``pread`` per chunk, GIL
released); once read, it replaces a pooled chunk chosen uniformly at random
(released from the cache), so the pool stays full and reads overlap sampling.
``warm_up`` fills the pool at once (one sequential read per chunk).

How this differs from uniform (docs/replay.md has the measurements):

* marginally, every stored row is equally likely in the long run: chunks
  enter uniformly, stay a random (geometric) time independent of their
  content, and rows within the pool are drawn uniformly;
* within a stretch of batches, rows come from the ``pool_chunks`` pooled
  chunks only, so rows of one batch are correlated (fewer distinct chunks,
  hence fewer distinct time periods, than an i.i.d. batch);
* the chunk being written joins the pool only when drawn, like any other.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections import deque

import numpy as np

from .persistent import PersistentReplay


class StagedSampler:
    def __init__(self, replay: PersistentReplay, pool_chunks: int, *, turnover_every: int = 4,
                 seed: int | None = None):
        if pool_chunks < 1 or turnover_every < 1:
            raise ValueError("pool_chunks and turnover_every must be at least 1")
        self.replay = replay
        self.pool_chunks = pool_chunks
        self.turnover_every = turnover_every
        self.pool: list[int] = []
        self.loading: deque[int] = deque()  # requested, in order
        self.batches = 0
        self._loaded: set[int] = set()
        self._swap_rng = np.random.default_rng(seed)  # which pooled chunk a new one replaces
        self._loaded_changed = threading.Condition()
        self._requests: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._load_loop, name="replay-stage", daemon=True)
        self._thread.start()

    # -- the loader thread -------------------------------------------------------
    def _load_loop(self) -> None:
        store = self.replay.store
        buffer = bytearray(store.layout.chunk_rows * store.row_bytes)
        while True:
            chunk = self._requests.get()
            if chunk is None:
                return
            start, length = store.page_range(chunk)
            with contextlib.suppress(OSError):  # a closed store: the sampler is being torn down
                os.preadv(store.fileno(), [memoryview(buffer)[:length]], start)  # into the page cache
            with self._loaded_changed:
                self._loaded.add(chunk)
                self._loaded_changed.notify_all()

    def close(self, timeout_s: float = 5.0) -> None:
        self._requests.put(None)
        self._thread.join(timeout_s)

    # -- the pool ----------------------------------------------------------------
    def _admit(self, rng: np.random.Generator) -> None:
        ring = self.replay.store.ring
        taken = set(self.pool) | set(self.loading)
        candidates = [int(c) for c in np.flatnonzero(ring.fill > 0) if int(c) not in taken]
        if candidates:
            chunk = candidates[int(rng.integers(len(candidates)))]
            self.loading.append(chunk)
            self._requests.put(chunk)

    def _join_loaded(self, wait_s: float = 0.0) -> None:
        with self._loaded_changed:
            if wait_s and self.loading and not self._loaded:
                self._loaded_changed.wait_for(lambda: bool(self._loaded), wait_s)
            ready = [c for c in self.loading if c in self._loaded]
            self._loaded -= set(ready)
        for chunk in ready:
            self.loading.remove(chunk)
            if len(self.pool) >= self.pool_chunks:  # a replacement: swap out a random pooled chunk
                out = self.pool.pop(int(self._swap_rng.integers(len(self.pool))))
                self.replay.cache.borrow(out, False)
                self.replay.store.release(out)
            self.pool.append(chunk)
            self.replay.cache.borrow(chunk, True)

    def warm_up(self, rng: np.random.Generator, timeout_s: float = 120.0) -> None:
        """Fill the pool now: one sequential read per chunk, all requested at once."""
        while len(self.pool) + len(self.loading) < self.pool_chunks:
            before = len(self.loading)
            self._admit(rng)
            if len(self.loading) == before:
                break
        with self._loaded_changed:
            self._loaded_changed.wait_for(lambda: set(self.loading) <= self._loaded, timeout_s)
        self._join_loaded()

    def _step(self, rng: np.random.Generator) -> None:
        if not self.pool and not self.loading:
            self._admit(rng)
        self._join_loaded()
        ring = self.replay.store.ring
        for gone in [c for c in self.pool if ring.fill[c] == 0]:  # evicted by the ring since
            self.pool.remove(gone)
            self.replay.cache.borrow(gone, False)
        if len(self.pool) + len(self.loading) < self.pool_chunks:
            self._admit(rng)  # grow to the pool size, one chunk per batch
        elif self.batches % self.turnover_every == 0 and not self.loading:
            self._admit(rng)  # a replacement: it swaps with a random pooled chunk once read
        self.batches += 1
        if not self.pool:  # nothing read yet: wait for the first load
            self._join_loaded(wait_s=30.0)
            if not self.pool:
                raise TimeoutError("staged sampler: no chunk loaded within 30 s")

    def chunk_weights(self) -> np.ndarray:
        ring = self.replay.store.ring
        weights = np.zeros(ring.chunks, np.float64)
        weights[self.pool] = ring.fill[self.pool]
        return weights

    def sample_indices(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(start, successor) slots of one batch from the pool; advances the pool by a batch."""
        with self.replay.lock:
            self._step(rng)
            return self.replay.sample_indices(rng, batch_size, chunk_weights=self.chunk_weights())

    def sample(self, rng: np.random.Generator, batch_size: int, discount: float, n_step: int = 1, **kw) -> dict:
        """A batch drawn from the pool (same fields as ``PersistentReplay.sample``)."""
        with self.replay.lock:
            self._step(rng)
            return self.replay.sample(rng, batch_size, discount, n_step, chunk_weights=self.chunk_weights(), **kw)
