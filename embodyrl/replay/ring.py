"""Index arithmetic of the ring over chunks: where rows go, which chunk is evicted.

Pure bookkeeping in RAM (no files), so it can be tested exhaustively. The
ring is FIFO over chunks: when the chunk being written is full, the next one
is an empty chunk if any, else the oldest chunk (by generation) that holds no
retained row. A chunk holding any row of a retained source (demonstrations)
is pinned and never evicted.
"""

from __future__ import annotations

import numpy as np

from ..hal.steps import Source

SOURCES = max(Source) + 1


class ReplayFullError(RuntimeError):
    """Every chunk is pinned by retained sources: nothing may be evicted."""


class ChunkRing:
    def __init__(self, chunks: int, chunk_rows: int, retained: tuple[int, ...] = (Source.DEMONSTRATION,)):
        self.chunk_rows = chunk_rows
        self.retained = tuple(int(s) for s in retained)
        self.generation = np.full(chunks, -1, np.int64)  # -1: empty
        self.fill = np.zeros(chunks, np.int64)
        self.pinned = np.zeros(chunks, bool)
        self.source_rows = np.zeros((chunks, SOURCES), np.int64)
        self.current = -1
        self.next_generation = 0
        self._limit_cache: np.ndarray | None = None
        self._cum_cache: np.ndarray | None = None
        self._offsets = np.arange(chunk_rows, dtype=np.int64)  # a chunk's row offsets, for apply's slots

    @property
    def chunks(self) -> int:
        return len(self.fill)

    @property
    def size(self) -> int:
        return int(self.fill.sum())

    def row_valid(self, slots: np.ndarray) -> np.ndarray:
        """Slots that hold a stored row (negative or out-of-range slots are invalid)."""
        chunk = slots // self.chunk_rows
        safe = np.minimum(chunk, self.chunks - 1)  # -1 wraps harmlessly: slots >= 0 decides
        return (slots >= 0) & (slots < self._limit()[safe])

    def _limit(self) -> np.ndarray:
        """Per chunk, one past its last stored slot (its base while empty)."""
        if self._limit_cache is None:
            self._limit_cache = np.arange(self.chunks, dtype=np.int64) * self.chunk_rows + self.fill
        return self._limit_cache

    def cumulative_fill(self) -> np.ndarray:
        if self._cum_cache is None:
            self._cum_cache = np.cumsum(self.fill)
        return self._cum_cache

    def changed(self) -> None:
        """Drop what was derived from the fills (call after any change to them)."""
        self._limit_cache = self._cum_cache = None

    def _pick_next(self, exclude: set[int]) -> int:
        """The first empty chunk not excluded, else the oldest unpinned one (in numpy: a ring of
        thousands of chunks costs no Python loop over them per batch)."""
        usable = np.ones(self.chunks, bool)
        usable[list(exclude)] = False
        empty = np.flatnonzero(usable & (self.generation < 0))
        if len(empty):
            return int(empty[0])
        usable &= ~self.pinned
        if 0 <= self.current < self.chunks:
            usable[self.current] = False
        if not usable.any():
            raise ReplayFullError(
                f"replay full: all {self.chunks} chunks are pinned by retained sources {self.retained} "
                "or in use; raise the capacity or retain fewer sources")
        return int(np.argmin(np.where(usable, self.generation, np.iinfo(np.int64).max)))

    def room(self) -> int:
        """Most rows one batch may have: the current chunk's rest and every other unpinned chunk."""
        others = int(np.count_nonzero(~self.pinned))
        rest = 0
        if self.current >= 0:
            rest = self.chunk_rows - int(self.fill[self.current])
            others -= int(not self.pinned[self.current])
        return rest + others * self.chunk_rows

    def plan(self, n: int) -> tuple[list[tuple[int, int, int]], list[int]]:
        """Where ``n`` rows go: ([(chunk, first offset, count)], chunks to evict first).

        Does not change the ring; :meth:`apply` does. Raises
        :class:`ReplayFullError` when the rows cannot be placed.
        """
        chunk = self.current
        if chunk >= 0 and n <= self.chunk_rows - int(self.fill[chunk]):  # the common batch: it fits
            return [(chunk, int(self.fill[chunk]), n)], []
        room = self.room()
        if n > room:
            raise ReplayFullError(f"a batch of {n} rows exceeds the {room} rows this ring can take "
                                  f"({int(self.pinned.sum())} of {self.chunks} chunks pinned by retained sources)")
        segments: list[tuple[int, int, int]] = []
        evict: list[int] = []
        chunk = self.current
        offset = int(self.fill[chunk]) if chunk >= 0 else self.chunk_rows
        used = {chunk} if chunk >= 0 else set()
        while n > 0:
            if offset == self.chunk_rows:
                chunk = self._pick_next(used)
                used.add(chunk)
                offset = 0
                if self.generation[chunk] >= 0:
                    evict.append(chunk)
            count = min(n, self.chunk_rows - offset)
            segments.append((chunk, offset, count))
            offset += count
            n -= count
        return segments, evict

    def evict(self, chunk: int) -> None:
        self.generation[chunk] = -1
        self.fill[chunk] = 0
        self.pinned[chunk] = False
        self.source_rows[chunk] = 0
        self.changed()

    def apply(self, segments: list[tuple[int, int, int]], sources: np.ndarray) -> np.ndarray:
        """Record rows written per ``segments``; ``sources`` per row. Returns their slots."""
        slots = np.empty(len(sources), np.int64)
        i = 0
        for chunk, offset, count in segments:
            if chunk != self.current:
                self.generation[chunk] = self.next_generation
                self.next_generation += 1
                self.current = chunk
            src = sources[i:i + count]
            np.add(self._offsets[offset:offset + count], chunk * self.chunk_rows, out=slots[i:i + count])
            self.fill[chunk] = offset + count
            first = int(src[0])
            if first < SOURCES and not np.count_nonzero(src != first):  # one source: no histogram
                self.source_rows[chunk, first] += count
            else:
                self.source_rows[chunk] += np.bincount(src, minlength=SOURCES)[:SOURCES]
            if any(self.source_rows[chunk, s] for s in self.retained):
                self.pinned[chunk] = True
            i += count
        self.changed()
        return slots

    # -- persistence (the index file holds this state) ---------------------------
    def state(self) -> dict:
        return {"generation": self.generation.tolist(), "fill": self.fill.tolist(),
                "pinned": self.pinned.tolist(), "source_rows": self.source_rows.tolist(),
                "current": self.current, "next_generation": self.next_generation}

    def load(self, state: dict) -> None:
        self.generation[:] = state["generation"]
        self.fill[:] = state["fill"]
        self.pinned[:] = state["pinned"]
        self.source_rows[:] = state["source_rows"]
        self.current = int(state["current"])
        self.next_generation = int(state["next_generation"])
        self.changed()
        if (self.fill > self.chunk_rows).any() or (self.fill < 0).any():
            raise ValueError("index: a chunk fill lies outside [0, chunk_rows]")
