"""Write-behind for the replay's data file: one thread writes large batches while ingest goes on.

Copying a 2.7 MB image batch into the page cache (``os.pwrite``) takes 0.3 to
2 ms here, longer than raw ZeroMQ takes to move it. ``pwrite`` releases the
GIL, so on this thread it overlaps receiving, decoding and validating the
next batch instead of following it. The rules that keep it correct:

* jobs run one at a time, in the order they were submitted, so a link patch
  submitted after a row's write lands after it;
* bounded: at most ``depth`` jobs wait; ``submit`` blocks beyond that (with
  a deadline), so the memory held is ``depth`` staging buffers;
* a commit waits (``wait(ticket)``) for every write submitted before its
  snapshot before it syncs; readers of rows wait for all (``drain``);
* a failed write is raised at the next ``submit``, ``wait`` or ``drain`` and
  at every one after: no commit covers rows after a lost write, so none of
  them is ever acknowledged;
* so is any failure on the caller's thread once the ring counts a batch's
  rows (an inline ``pwrite``, a ``submit`` that timed out): :class:`RowWriter`
  keeps the first one for good, across ``close``, and raises
  :class:`RowsLost` naming it at every later write, commit and read;
* the caller's arrays are copied into the staging buffer before ``submit``,
  so a caller may reuse them as soon as ``add`` returns.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import deque
from collections.abc import Callable

import numpy as np

DEFAULT_DEADLINE_S = 120.0


class RowsLost(OSError):
    """Rows the ring counts never reached the data file: no commit may cover them, no reader see them."""


class WriteBehind:
    def __init__(self, depth: int = 4, deadline_s: float = DEFAULT_DEADLINE_S):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.depth = depth
        self.deadline_s = deadline_s
        self.submitted = 0
        """Jobs submitted so far: a commit's ticket."""
        self.done = 0
        """Jobs finished (or skipped after a failure)."""
        self._jobs: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="replay-write", daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Nothing queued or being written: a write made now lands in order."""
        return self.done == self.submitted

    def submit(self, job: Callable[[], None]) -> int:
        """Queue ``job`` (it writes); wait while ``depth`` jobs wait. Returns its ticket."""
        with self._cond:
            self._wait_for(lambda: len(self._jobs) < self.depth, "a free slot in the write queue")
            if self._closed:
                raise RuntimeError("write-behind is closed")
            self._jobs.append(job)
            self.submitted += 1
            self._cond.notify_all()
            return self.submitted

    def wait(self, ticket: int) -> None:
        """Return once the first ``ticket`` jobs are written; raise a failed write's error."""
        with self._cond:
            self._wait_for(lambda: self.done >= ticket, f"write {ticket} to finish")

    def drain(self) -> None:
        """Return once every job submitted so far is written."""
        if self.done != self.submitted or self._error is not None:
            self.wait(self.submitted)

    @property
    def error(self) -> BaseException | None:
        """The failed write's error, if one failed."""
        return self._error

    def close(self) -> None:
        """Finish the queued jobs and stop the thread (a failed write is not raised here: see
        ``error``). Raises TimeoutError if the thread is still writing after the deadline."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(self.deadline_s)
        if self._thread.is_alive():
            raise TimeoutError(f"replay write-behind: a write still runs after {self.deadline_s} s")

    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        """Wait on the condition (held) until ``ready`` or an error; a deadline, never forever."""
        if not self._cond.wait_for(lambda: ready() or self._error is not None, self.deadline_s):
            raise TimeoutError(f"replay write-behind: no progress within {self.deadline_s} s waiting for {what}")
        if self._error is not None:
            raise OSError(f"replay write-behind: a write failed ({self._error!r}); "
                          "rows after it are not durable") from self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._closed)
                if not self._jobs:
                    return
                job = self._jobs[0]
                failed = self._error is not None
            if not failed:  # after a failure nothing more is written: a commit must not cover it
                try:
                    job()
                except BaseException as err:  # noqa: BLE001 - handed to the threads that wait
                    with self._cond:
                        self._error = err
            with self._cond:
                self._jobs.popleft()
                self.done += 1
                self._cond.notify_all()


class RowWriter:
    """The data file's writes: packed rows and link patches, on this thread or behind it.

    A batch of at least ``behind_bytes`` (None: never) goes to a
    :class:`WriteBehind` thread, and so does everything after it until that
    thread is idle again, so writes land in submission order. The first
    failure (here or on the thread) sticks: see :meth:`check`.
    """

    def __init__(self, fd: int, dtype: np.dtype, behind_bytes: int | None, depth: int, path: str):
        self._fd = fd
        self._dtype = dtype
        self._behind_bytes = behind_bytes
        self._depth = depth
        self._path = path
        self._staging = np.zeros(0, dtype)  # this thread's buffer, reused
        self._free: deque[np.ndarray] = deque()  # the writer thread's buffers, back once written
        self._thread: WriteBehind | None = None
        self._behind = False  # the batch being packed goes behind
        self.failure: BaseException | None = None
        """The first write that failed (kept for good, across ``close``)."""

    def fail(self, err: BaseException) -> None:
        """Record that rows the ring counts may not be on disk (the first cause is kept)."""
        if self.failure is None:
            self.failure = err

    def check(self) -> None:
        """Raise :class:`RowsLost` naming the first failure, if any: nothing after it is durable."""
        if self.failure is None and self._thread is not None and self._thread.error is not None:
            self.failure = self._thread.error
        if self.failure is not None:
            raise RowsLost(errno.EIO, f"{self._path}: a row write failed ({self.failure!r}); rows counted "
                           "after it are not on disk, so nothing more is committed, acknowledged or read. "
                           "close(commit=False) and reopen: the replay continues from its last commit")

    def _busy(self) -> bool:
        return self._thread is not None and not self._thread.idle

    def staging(self, n: int) -> np.ndarray:
        """A buffer of at least ``n`` rows to pack the next batch into (zeroed once, reused: no
        fresh pages per batch); one no queued write uses when the batch goes behind."""
        self._behind = self._behind_bytes is not None and n * self._dtype.itemsize >= self._behind_bytes
        self._behind = self._behind or self._busy()
        if not self._behind:
            if len(self._staging) < n:
                self._staging = np.zeros(n, self._dtype)
            return self._staging
        buffer = self._free.popleft() if self._free else None  # at most depth + 1 exist
        return buffer if buffer is not None and len(buffer) >= n else np.zeros(n, self._dtype)

    def write(self, writes: list[tuple], staging: np.ndarray) -> None:
        """Write ``(buffer, file offset)`` or ``(buffers, file offset, bytes)`` pieces of ``staging`` (from
        :meth:`staging`) and of the columns they name: behind, those columns must stay
        unchanged until the write lands (received frames are never written to)."""
        self.check()
        try:
            if not self._behind:
                for write in writes:
                    self._pwrite(*write)
                return
            if self._thread is None:
                self._thread = WriteBehind(self._depth)

            def job() -> None:
                for write in writes:
                    self._pwrite(*write)
                self._free.append(staging)

            self._thread.submit(job)
        except BaseException as err:  # an inline write or a submit that timed out: rows lost
            self.fail(err)
            raise

    def patch(self, data: bytes, position: int) -> None:
        """A small write that must land after every write submitted before it."""
        self.check()
        try:
            if self._busy():
                self._thread.submit(lambda: self._pwrite(data, position))
            else:
                self._pwrite(data, position)
        except BaseException as err:
            self.fail(err)
            raise

    def advise(self, call: Callable[[], None]) -> None:
        """Page-cache advice (release, populate): on the writer thread once it runs, after the
        writes before it and off the ingest thread; advice that fails is ignored there."""
        if self._thread is None:
            call()
            return

        def job() -> None:
            with contextlib.suppress(OSError, ValueError):  # advice, never a reason to fail a commit
                call()

        self._thread.submit(job)

    def ticket(self) -> int:
        """Writes submitted so far: what a commit snapshotted now must wait for."""
        self.check()
        return self._thread.submitted if self._thread is not None else 0

    def wait(self, ticket: int) -> None:
        self.check()
        if ticket and self._thread is not None:
            try:
                self._thread.wait(ticket)
            finally:
                self.check()  # a write that failed meanwhile: RowsLost, naming it

    def drain(self) -> None:
        self.check()
        if self._thread is not None:
            try:
                self._thread.drain()
            finally:
                self.check()

    def close(self) -> None:
        """Stop the writer thread once its queued writes have landed. Raises TimeoutError (and
        keeps the thread) if it is still writing: the file must then stay open for it."""
        if self._thread is not None:
            try:
                self._thread.close()
            except TimeoutError as err:
                self.fail(err)  # whatever it still writes, no commit may count on it
                raise
            if self._thread.error is not None:
                self.fail(self._thread.error)
            self._thread = None

    def _pwrite(self, data, position: int, expected: int | None = None) -> None:
        """Write one buffer, or a list of ``expected`` bytes back to back (``pwritev``); a short
        write raises."""
        if isinstance(data, list):
            written = os.pwritev(self._fd, data, position)
        else:
            written, expected = os.pwrite(self._fd, data, position), memoryview(data).nbytes
        if written != expected:  # a full disk writes short
            raise OSError(errno.ENOSPC, f"{self._path}: row write cut short (disk full?)")
