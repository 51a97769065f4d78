"""The RAM budget for hot data: which chunks the page cache should hold, and release.

Data pages are file-backed (the kernel's page cache), so the buffer's own
anonymous memory stays small whatever the data size; the budget bounds how
much of the page cache this buffer *keeps* of its own data. The policy:

1. a tenth of the budget (``cold_fraction``) is kept for cold reads; the
   rest holds hot chunks;
2. the most recent chunks (by generation) are always hot, as many as half
   the hot part holds (at least the one being written);
3. then retained chunks (demonstrations), most recent first, while the
   hot part lasts: source mixing samples them far more often than their share;
4. every other chunk is read on demand when a sample needs it, and its
   pages are released (``MADV_DONTNEED`` + ``POSIX_FADV_DONTNEED``) as soon
   as the pages cold reads brought in since the last release could fill the
   cold part (counted per row read: the mapping is ``MADV_RANDOM``, so a
   miss reads only its own pages), and at least every ``release_every``
   samples. Hot part plus cold reads stay within the budget.

A chunk that leaves the hot set is released at once.
"""

from __future__ import annotations

import mmap

import numpy as np

from .store import ChunkStore

PAGE = mmap.PAGESIZE


class CachePolicy:
    def __init__(self, store: ChunkStore, budget_bytes: int, release_every: int = 64,
                 cold_fraction: float = 0.1):
        self.store = store
        self.chunk_bytes = store.layout.chunk_rows * store.row_bytes
        self.cold_bytes = int(budget_bytes * cold_fraction)
        """What cold reads may bring into the page cache between two releases."""
        self.budget_chunks = max(1, int((budget_bytes - self.cold_bytes) // self.chunk_bytes))
        self.release_every = release_every
        row_bytes = store.row_bytes
        self._bytes_per_cold_row = (-(-row_bytes // PAGE) + (row_bytes % PAGE != 0)) * PAGE  # pages a row spans, at most
        self._cold_read = 0
        self.hot = np.zeros(store.layout.chunks, bool)
        self.all_hot = True
        self.borrowed = np.zeros(store.layout.chunks, bool)  # held hot by a staged sampler's pool
        self._own = self.hot
        self._populated = np.ones(store.layout.chunks, bool)  # a reopen maps lazily: it reads nothing
        self._touched = np.zeros(store.layout.chunks, bool)
        self._samples = 0
        self._release_pending = False
        self._generation_seen = -1
        self.refresh()
        self._populated[:] = False

    def refresh(self) -> None:
        """Recompute the hot set after the ring moved on; release chunks that left it."""
        ring = self.store.ring
        if ring.next_generation == self._generation_seen:
            return
        self._generation_seen = ring.next_generation
        stored_mask = ring.generation >= 0
        if int(np.count_nonzero(stored_mask)) <= self.budget_chunks:  # all of it fits: all of it hot
            self._keep(stored_mask)
            return
        stored = np.flatnonzero(stored_mask)
        by_recency = stored[np.argsort(-ring.generation[stored])]
        recent = by_recency[:max(1, self.budget_chunks // 2)]
        hot = np.zeros_like(self.hot)
        hot[recent] = True
        room = self.budget_chunks - len(recent)
        retained = by_recency[ring.pinned[by_recency] & ~hot[by_recency]][:max(0, room)]  # numpy: no loop
        hot[retained] = True  # over thousands of chunks each time a chunk fills
        room -= len(retained)
        if room > 0:  # budget left: keep the next most recent too
            rest = by_recency[~hot[by_recency]][:room]
            hot[rest] = True
        self._keep(hot)

    def _keep(self, hot: np.ndarray) -> None:
        """Make ``hot`` the chunks kept: release those that left it, map in the full ones that joined."""
        ring = self.store.ring
        for chunk in np.flatnonzero(self.hot & ~hot & ~self.borrowed):  # behind the writes, if they are
            self.store.release_soon(int(chunk))
        for chunk in np.flatnonzero(hot & ~self._populated):  # full chunks stay mapped
            if ring.fill[chunk] == ring.chunk_rows:
                self.store.populate_soon(int(chunk))
                self._populated[chunk] = True
        self._populated &= hot
        self._own = hot
        self._set_hot()

    def _set_hot(self) -> None:
        self.hot = self._own | self.borrowed
        self.all_hot = bool(self.hot[self.store.ring.fill > 0].all())

    def borrow(self, chunk: int, held: bool) -> None:
        """Mark a chunk hot (``held``) or not on behalf of a staged sampler's pool."""
        self.borrowed[chunk] = held
        self._set_hot()

    def touched(self, slots: np.ndarray) -> None:
        """Note chunks a sample read. They are released at the start of a later sample
        (:meth:`release_due`), never here: that would evict the pages just hinted for this one's
        gather, which would then read them again a fault at a time."""
        chunks = slots // self.store.layout.chunk_rows
        self._touched[chunks] = True
        self._cold_read += int(np.count_nonzero(~self.hot[chunks])) * self._bytes_per_cold_row
        self._samples += 1
        if self._cold_read >= self.cold_bytes or self._samples % self.release_every == 0:
            self._release_pending = True

    def release_due(self) -> None:
        """Before a sample reads: release the cold chunks earlier samples read, once their reads
        could fill the cold part of the budget (or every ``release_every`` samples)."""
        if not self._release_pending:
            return
        for chunk in np.flatnonzero(self._touched & ~self.hot):
            self.store.release(int(chunk))
        self._touched[:] = False
        self._cold_read = 0
        self._release_pending = False

    def is_cold(self, slots: np.ndarray) -> np.ndarray:
        return ~self.hot[slots // self.store.layout.chunk_rows]

    def to_hint(self, slots: np.ndarray) -> np.ndarray:
        """Slots whose pages may be absent: cold chunks, and hot ones not yet mapped in
        (after a reopen or ``forget_resident``), so their faults too are read in parallel.
        A staged pool's chunks were read whole: never hinted."""
        chunk = slots // self.store.layout.chunk_rows
        return ~self.hot[chunk] | ~(self._populated[chunk] | self.borrowed[chunk])

    def forget_resident(self) -> None:
        """The page cache was dropped: no chunk is known to be resident any more."""
        self._populated[:] = False

    def chunk_weights(self, hot_weight: float) -> np.ndarray:
        """Chunk draw weights for the cache-preferring mode: hot rows ``hot_weight`` x as likely."""
        fill = self.store.ring.fill.astype(np.float64)
        return fill * np.where(self.hot, hot_weight, 1.0)

    def tv_from_uniform(self, hot_weight: float) -> float:
        """Exact total-variation distance between the cache-preferring and the uniform row draw."""
        fill = self.store.ring.fill.astype(np.float64)
        if fill.sum() == 0:
            return 0.0
        w = self.chunk_weights(hot_weight)
        p_row = np.where(fill > 0, w / w.sum() / np.maximum(fill, 1), 0.0)
        q_row = 1.0 / fill.sum()
        return float(0.5 * np.sum(fill * np.abs(p_row - q_row)))
