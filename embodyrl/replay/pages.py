"""Page-cache hints on the replay's data file: read ahead, map in, release.

A mixin of :class:`~.store.ChunkStore` (it provides ``_mmap``, ``_fd``,
``layout``, ``row_bytes`` and ``_writer``): the policy of what to keep
lives in ``cache.py``; these are the system calls it asks for.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os

import numpy as np

_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14


def keep_freed_heap(mmap_threshold: int = 16 << 20, trim_threshold: int = 32 << 20) -> None:
    """Keep freed memory of up to ``mmap_threshold`` bytes a block in the heap (glibc only; a no-op
    elsewhere). A batch of image rows gathers into arrays of several MB; glibc serves those from the
    main heap once one was freed, but trims the heap's top as soon as both of a batch's arrays are
    freed, so every batch faulted its output in again, page by page (about 1,000 faults, 2.4 ms, a
    fifth of a cold image batch here). Both thresholds must be set: setting either one stops glibc's
    own adaptation. Costs up to ``trim_threshold`` of freed heap kept resident."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, mmap_threshold)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, trim_threshold)  # M_TRIM_THRESHOLD


class PageHints:
    def page_range(self, chunk: int) -> tuple[int, int]:
        start = chunk * self.layout.chunk_rows * self.row_bytes
        return start, self.layout.chunk_rows * self.row_bytes

    def release(self, chunk: int) -> None:
        """Drop a chunk's pages from this mapping and from the page cache."""
        start, length = self.page_range(chunk)
        head = start - start % mmap.PAGESIZE
        self._mmap.madvise(mmap.MADV_DONTNEED, head, length + start - head)
        os.posix_fadvise(self._fd, start, length, os.POSIX_FADV_DONTNEED)

    def release_soon(self, chunk: int) -> None:
        """:meth:`release`, on the writer thread when there is one (the ingest path's releases)."""
        self._writer.advise(lambda: self.release(chunk))

    def populate_soon(self, chunk: int) -> None:
        """:meth:`populate`, on the writer thread when there is one."""
        self._writer.advise(lambda: self.populate(chunk))

    def warm(self, chunk: int) -> None:
        """Ask the kernel to read a chunk ahead, asynchronously."""
        start, length = self.page_range(chunk)
        os.posix_fadvise(self._fd, start, length, os.POSIX_FADV_WILLNEED)

    def will_need(self, slots: np.ndarray, span: int = 2) -> None:
        """Start reading the pages of ``slots`` (and the ``span - 1`` rows after each, where
        successors usually are) in parallel before a gather faults them in.

        Runs of adjacent pages go out as one hint, so a multi-page row is one read.
        """
        page = mmap.PAGESIZE
        slots = np.unique(slots)  # sorted: each row's pages, then runs of them that touch or overlap
        first = slots * self.row_bytes // page
        end = self.layout.capacity * self.row_bytes - 1
        last = np.maximum.accumulate(np.minimum((slots + span) * self.row_bytes - 1, end) // page)
        breaks = np.flatnonzero(first[1:] > last[:-1] + 1)
        starts = first[np.concatenate([[0], breaks + 1])]
        ends = last[np.concatenate([breaks, [len(last) - 1]])]
        advise = self._mmap.madvise  # the kernel queues them all at once (pread threads: no faster, see docs)
        ranges = list(zip(starts.tolist(), ends.tolist(), strict=True))
        for a, b in ranges:
            advise(mmap.MADV_WILLNEED, a * page, (b - a + 1) * page)
        # then map them in, a range a call, as the reads land: the gather takes no fault a page
        with contextlib.suppress(OSError):  # a kernel before 5.14: the gather faults them in
            for a, b in ranges:
                advise(_MADV_POPULATE_READ, a * page, (b - a + 1) * page)

    def populate(self, chunk: int) -> None:
        """Map a resident chunk's pages into this process now (MADV_POPULATE_READ), so hot
        gathers take no minor page faults; a no-op where the kernel lacks it."""
        start, length = self.page_range(chunk)
        head = start - start % mmap.PAGESIZE
        with contextlib.suppress(OSError):
            self._mmap.madvise(_MADV_POPULATE_READ, head, length + start - head)

    def drop_page_cache(self) -> None:
        """Evict every page of the data file from the page cache (cold-read benchmarks)."""
        self._mmap.madvise(mmap.MADV_DONTNEED)
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
