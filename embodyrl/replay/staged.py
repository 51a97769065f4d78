"""Chunks then rows: fast sampling when the buffer is many times larger than its RAM budget.

I.i.d. uniform rows from a cold buffer cost one random page read each (about
3-15 ms per batch of 256 here, whatever the hints), so the disk's random-read
rate, not the code, bounds them. This sampler instead keeps a *pool* of whole
chunks resident (read sequentially, ahead of time, with ``POSIX_FADV_WILLNEED``)
and draws each batch's rows i.i.d. uniformly from the pool's rows. Every
``turnover_every`` batches one pool chunk, chosen uniformly at random, is
released and one stored chunk, chosen uniformly among those not pooled, is
read in; it joins the pool ``load_lag`` batches later, so its read overlaps
sampling.

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

from collections import deque

import numpy as np

from .persistent import PersistentReplay


class StagedSampler:
    def __init__(self, replay: PersistentReplay, pool_chunks: int, *, turnover_every: int = 4,
                 load_lag: int = 2, initial_chunks: int = 2):
        if pool_chunks < 1 or turnover_every < 1:
            raise ValueError("pool_chunks and turnover_every must be at least 1")
        self.replay = replay
        self.pool_chunks = pool_chunks
        self.turnover_every = turnover_every
        self.load_lag = load_lag
        self.pool: list[int] = []
        self.loading: deque[tuple[int, int]] = deque()  # (chunk, batch at which it joins)
        self.batches = 0
        self._initial = initial_chunks

    def _stored_candidates(self) -> np.ndarray:
        ring = self.replay.store.ring
        taken = set(self.pool) | {c for c, _ in self.loading}
        stored = np.flatnonzero(ring.fill > 0)
        return np.array([c for c in stored if int(c) not in taken], np.int64)

    def _admit(self, rng: np.random.Generator, lag: int) -> None:
        candidates = self._stored_candidates()
        if len(candidates):
            chunk = int(rng.choice(candidates))
            self.replay.store.warm(chunk)
            self.loading.append((chunk, self.batches + lag))

    def _step(self, rng: np.random.Generator) -> None:
        if not self.pool and not self.loading:
            for _ in range(self._initial):
                self._admit(rng, 0)
        while self.loading and self.loading[0][1] <= self.batches:
            self._join()
        # drop pooled chunks the ring evicted since
        ring = self.replay.store.ring
        for gone in [c for c in self.pool if ring.fill[c] == 0]:
            self.pool.remove(gone)
            self.replay.cache.borrow(gone, False)
        if len(self.pool) + len(self.loading) < self.pool_chunks:
            self._admit(rng, self.load_lag)  # grow to the pool size, one chunk per batch
        elif self.batches % self.turnover_every == 0 and self.pool:
            out = self.pool.pop(int(rng.integers(len(self.pool))))
            self.replay.cache.borrow(out, False)
            self.replay.store.release(out)
            self._admit(rng, self.load_lag)
        self.batches += 1

    def _join(self) -> None:
        chunk = self.loading.popleft()[0]
        self.pool.append(chunk)
        self.replay.cache.borrow(chunk, True)

    def chunk_weights(self) -> np.ndarray:
        ring = self.replay.store.ring
        weights = np.zeros(ring.chunks, np.float64)
        weights[self.pool] = ring.fill[self.pool]
        return weights

    def sample(self, rng: np.random.Generator, batch_size: int, discount: float, n_step: int = 1, **kw) -> dict:
        """A batch drawn from the pool (same fields as ``PersistentReplay.sample``)."""
        with self.replay.lock:
            self._step(rng)
            if not self.pool:  # nothing loaded yet: wait for the oldest load
                self._join()
            return self.replay.sample(rng, batch_size, discount, n_step, chunk_weights=self.chunk_weights(), **kw)
