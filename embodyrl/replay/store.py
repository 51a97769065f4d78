"""Durable storage of the step stream: one memory-mapped file of rows, an atomic index.

Directory layout::

    meta.json    the layout (capacity, chunk size, specs); written once
    data.bin     capacity rows of the row dtype (see layout.py), preallocated
    index-0/1    the last two commits (alternating): the chunk ring, open streams, per-actor seqs

Rows are written with ``pwrite`` (no dirty mapped pages, no anonymous
memory) and read through one read-only shared mapping of the whole file, so
a reopen maps the file and copies nothing. A commit is a group commit:
``fdatasync(data)``, then the index (length-prefixed, CRC-checked) is written
over the older of two index files and ``fdatasync``-ed: two syncs per commit,
no rename, no directory sync. ``commit_in_background`` takes the index
snapshot on the caller's thread and runs the syncs on one committer thread
(at most one commit in flight, so commits land in snapshot order);
``committed_seqs`` changes only once a commit is durable. A torn index
write fails its CRC, so the other file, one commit older, stands. A crash at
any instant therefore reopens to the last complete commit: rows after it lie
beyond the committed chunk fills and are never read. Before a chunk that
holds committed rows is overwritten, its eviction is durable, so a crash
mid-overwrite cannot expose a half-written row as an old one. Once the ring
is full, every commit records the chunks to be overwritten next (as many as
the largest batch spans, plus one; at most a quarter of the ring) as already evicted (in RAM they are still
served until then), so the learner rarely waits for an eviction's commit;
the price: a crash may lose those oldest chunks early. The commit records, for every
actor, the last wire sequence number whose rows it contains, atomically with
those rows. Fields of 4 KiB or more per row (images) are written straight
from the received column (``pwritev``), the rest packed into a staging
buffer first. Batches of at least ``write_behind_bytes`` (off by default)
are written by one writer thread (``writer.py``) while the caller goes on;
every commit waits for the writes its snapshot counts, and ``rows`` waits
for all of them, so readers and commits see what they expect. Once the ring
counts a batch, a failure to write it (either thread, or a write queue that
timed out) sticks: every later add, commit and read raises
:class:`~.writer.RowsLost` naming it, since the ring now counts rows the
file lacks; close(commit=False) and reopen continue from the last commit. A
failed commit (sync, index write) does not stick: it may be retried.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..hal.steps import Steps
from .indexfile import atomic_write, encode_index, read_index
from .layout import (
    DATA_FILE,
    INDEX_FILES,
    META_FILE,
    NEXT_GENERATION,
    NEXT_INDEX,
    Layout,
    as_stored,
    direct_fields,
    row_pieces,
    row_vectors,
    to_rows,
)
from .pages import PageHints
from .ring import ChunkRing, ReplayFullError
from .writer import RowWriter

_LINK = struct.Struct("=qq")
"""A stored row's (next_index, next_generation), the first two fields of its row, as a patch writes them."""

Stream = tuple[int, int]  # (actor id, device id)

class ChunkStore(PageHints):
    """Rows on disk in a ring of chunks, with crash-safe group commits."""

    def __init__(self, directory: Path, layout: Layout | None = None, *,
                 retained: tuple[int, ...] = (1,), write_behind_bytes: int | None = None,
                 write_depth: int = 4):
        """Open ``directory``, creating it with ``layout`` when it holds no replay.

        ``write_behind_bytes``: batches this large or larger are written by the writer thread
        (at most ``write_depth`` queued); None writes every batch on the caller's thread."""
        self.directory = Path(directory)
        meta = self.directory / META_FILE
        if meta.exists():
            stored = Layout.from_json(meta.read_text(), str(meta))
            if layout is not None and (stored.capacity, stored.chunk_rows, stored.dtype) != (
                    layout.capacity, layout.chunk_rows, layout.dtype):
                raise ValueError(f"{self.directory}: holds a replay of capacity {stored.capacity}, "
                                 f"chunk_rows {stored.chunk_rows} and specs that differ from the ones asked for")
            layout = stored
        elif layout is None:
            raise FileNotFoundError(f"{self.directory}: no replay here ({META_FILE} missing)")
        else:
            layout.validate()
            self.directory.mkdir(parents=True, exist_ok=True)
            self._create_data_file(layout)
            for name in INDEX_FILES:
                (self.directory / name).touch()
            atomic_write(meta, layout.to_json())
        self.layout = layout
        self.dtype = layout.dtype
        self.row_bytes = self.dtype.itemsize
        self.ring = ChunkRing(layout.chunks, layout.chunk_rows, retained)
        self.streams: dict[Stream, tuple[int, int, int]] = {}  # stream -> (slot, episode, step)
        self.committed_seqs: dict[int, int] = {}  # durable only; replaced whole, never mutated
        self._pending_seqs: dict[int, int] = {}
        self._planned: dict[int, int] = {}  # chunk -> first commit that records it evicted ahead
        self._largest_batch = 1
        self.eviction_waits = 0  # chunk boundaries where add had to wait for a commit of its own
        self.durable_commits = 0  # commits known durable (advances when a commit's syncs return)
        self._inflight: Future | None = None
        self._committer: ThreadPoolExecutor | None = None
        self._durable_lock = threading.Lock()
        self.pending_rows = 0
        self._pending_since = 0.0
        self.commits = 0
        self.rows_added = 0
        self._fd = os.open(self.directory / DATA_FILE, os.O_RDWR)
        expected = layout.capacity * self.row_bytes
        if os.fstat(self._fd).st_size != expected:
            os.close(self._fd)
            raise ValueError(f"{self.directory / DATA_FILE}: size differs from the layout's {expected} bytes")
        self._mmap = mmap.mmap(self._fd, expected, prot=mmap.PROT_READ)
        self._mmap.madvise(mmap.MADV_RANDOM)  # no 8 MB read-ahead per cold miss
        self._rows = np.frombuffer(self._mmap, self.dtype, count=layout.capacity)
        self._writer = RowWriter(self._fd, self.dtype, write_behind_bytes, write_depth,
                                 str(self.directory / DATA_FILE))
        self._direct = direct_fields(self.dtype)  # images: written from the received column
        self.has_direct_fields = bool(self._direct)
        self._pieces = row_pieces(self.dtype, self._direct)
        self._durable_slot = 0  # the index file holding the last durable commit (the first goes to 1)
        self._load_index()
        self._index_fds = [os.open(self.directory / name, os.O_RDWR | os.O_CREAT, 0o644) for name in INDEX_FILES]
        for slot, _, _ in self.streams.values():
            # an open row's link may point at rows the crash lost: unlink until its successor arrives
            self._write_link(slot, -1, -1)

    def _create_data_file(self, layout: Layout) -> None:
        path = self.directory / DATA_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        size = layout.capacity * layout.dtype.itemsize
        try:
            os.posix_fallocate(fd, 0, size)
            os.fsync(fd)
        except OSError as err:
            path.unlink(missing_ok=True)
            raise OSError(err.errno, f"{path}: cannot reserve {size} bytes ({layout.capacity} rows of "
                          f"{layout.dtype.itemsize}); lower the replay capacity or free disk space") from err
        finally:
            os.close(fd)

    # -- the index ---------------------------------------------------------------
    def _plan_eviction(self) -> None:
        """Once the ring is full, record the chunks it will overwrite next (as many as the
        largest batch so far spans, plus one, at most a quarter of the ring) as evicted in every commit from now on, so
        that by the time they are overwritten their eviction is usually durable already and
        ``add`` need not wait for a commit of its own. They stay planned until evicted."""
        ring = self.ring
        if ring.next_generation < ring.chunks or ring.current < 0 or (ring.generation < 0).any():
            return  # (the first: some chunk never had a generation, without a pass over them)
        needed = min(-(-self._largest_batch // self.layout.chunk_rows) + 1, max(1, ring.chunks // 4))
        while len(self._planned) < needed:
            try:
                chunk = ring._pick_next({ring.current, *self._planned})
            except ReplayFullError:
                return
            self._planned[chunk] = self.commits + 1  # from the next snapshot on

    def _index_bytes(self, seqs: dict[int, int]) -> bytes:
        state = self.ring.state()
        streams = self.streams
        for c in self._planned:
            state["generation"][c], state["fill"][c], state["pinned"][c] = -1, 0, False
            state["source_rows"][c] = [0] * len(state["source_rows"][c])
        if self._planned:
            rows = self.layout.chunk_rows
            streams = {k: v for k, v in streams.items() if v[0] // rows not in self._planned}
        body = {"commit": self.commits, "rows_added": self.rows_added, "ring": state,
                "streams": [[a, d, s, e, t] for (a, d), (s, e, t) in streams.items()],
                "actor_seqs": {str(a): q for a, q in seqs.items()}}
        return encode_index(body)

    def _load_index(self) -> None:
        bodies, errors, never_written = [], [], False
        for slot, name in enumerate(INDEX_FILES):
            try:
                body = read_index(self.directory / name)
            except ValueError as err:
                errors.append(str(err))
                continue
            if body is None:
                never_written = True
            else:
                bodies.append((slot, body))
        if not bodies:  # a torn first commit beside a never-written file: nothing was committed
            if errors and not never_written:
                raise ValueError(f"{self.directory}: corrupt index ({'; '.join(errors)}); the data file is "
                                 "intact, move the index files aside to inspect them")
            return
        # a torn newer write leaves the older commit
        self._durable_slot, body = max(bodies, key=lambda slot_body: slot_body[1]["commit"])
        try:
            self.ring.load(body["ring"])
            self.commits = int(body["commit"])
            self.rows_added = int(body["rows_added"])
            self.streams = {(a, d): (s, e, t) for a, d, s, e, t in body["streams"]}
            self.committed_seqs = {int(a): int(q) for a, q in body["actor_seqs"].items()}
            self.durable_commits = self.commits
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{self.directory}: corrupt index ({err})") from None

    def check(self) -> None:
        """Raise unless rows may be added, committed and read: the store is open and no row
        write has failed (:class:`~.writer.RowsLost` names the first failure, for good)."""
        if self._fd < 0:
            raise ValueError(f"{self.directory}: replay is closed")
        self._writer.check()

    def _snapshot(self) -> tuple[int, bytes, dict[int, int], int]:
        """The next commit's (number, index bytes, seqs, write ticket), from the state now
        (caller's thread).

        Every row it counts was ``pwrite``-n before this, or is among the
        first ``ticket`` writes of the writer thread, which the commit waits
        for, so the ``fdatasync`` that follows covers it; rows added later are
        beyond its fills.
        """
        self.check()
        seqs = {**self.committed_seqs, **self._pending_seqs}  # in-flight seqs are pending until durable
        self._pending_seqs.clear()
        self._plan_eviction()
        self.commits += 1
        self.pending_rows = 0
        ticket = self._writer.ticket()
        return self.commits, self._index_bytes(seqs), seqs, ticket

    def _make_durable(self, number: int, index: bytes, seqs: dict[int, int], ticket: int = 0) -> None:
        """Wait for the writes the snapshot counts, sync the rows, then write the index into the
        file that does NOT hold the last durable commit: a failed write (a full disk) can tear
        only the file that was already stale."""
        slot = 1 - self._durable_slot
        self._writer.wait(ticket)
        os.fdatasync(self._fd)
        fd = self._index_fds[slot]
        if os.pwrite(fd, index, 0) != len(index):  # a full disk writes short, without raising
            raise OSError(errno.ENOSPC, f"{self.directory}: index write cut short (disk full?)")
        os.fdatasync(fd)
        with self._durable_lock:
            self.committed_seqs = seqs
            self.durable_commits = number
            self._durable_slot = slot

    def _requeue(self, seqs: dict[int, int]) -> None:
        """A failed commit's seqs stay pending for the next one (on the caller's thread, the
        one ``add`` runs on, so no update to ``_pending_seqs`` is lost)."""
        for actor, seq in seqs.items():
            if seq > self.committed_seqs.get(actor, 0):
                self._pending_seqs[actor] = max(seq, self._pending_seqs.get(actor, 0))

    def settle(self) -> None:
        """Wait for the commit in flight; raise its error (its rows stay unacknowledged)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            error = inflight.exception()
            if error is not None:
                self._requeue(inflight.seqs)
                raise error

    def commit(self) -> None:
        """Make every row added so far durable, with the actors' sequence numbers (waits)."""
        self.settle()
        snapshot = self._snapshot()
        try:
            self._make_durable(*snapshot)
        except BaseException:
            self._requeue(snapshot[2])
            raise

    @property
    def committing(self) -> bool:
        """A background commit is in flight."""
        return self._inflight is not None and not self._inflight.done()

    def commit_in_background(self) -> bool:
        """Start a group commit of every row added so far on the committer thread.

        Returns False (starting nothing) while the previous one is in flight.
        Raises the error of a finished one that failed.
        """
        if self.committing:
            return False
        self.settle()
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix="replay-commit")
        snapshot = self._snapshot()
        self._inflight = self._committer.submit(self._make_durable, *snapshot)
        self._inflight.seqs = snapshot[2]  # re-queued by settle if the commit fails
        return True

    def commit_due(self, interval_s: float) -> bool:
        """A group commit is due: rows wait and the oldest has waited ``interval_s``, or they
        fill a chunk, or an eviction planned ahead is in no commit yet (so it is durable well
        before the ring reaches that chunk)."""
        unrecorded = any(n > self.commits for n in self._planned.values())
        return self.pending_rows > 0 and (
            unrecorded or time.monotonic() - self._pending_since >= interval_s
            or self.pending_rows >= self.layout.chunk_rows)

    # -- writing -----------------------------------------------------------------
    def add(self, steps: Steps, seq: int | None = None, on_evict=None) -> np.ndarray:
        """Append one stream's consecutive rows; returns their slots.

        ``seq`` (the wire sequence number) becomes the actor's committed seq
        at the next commit. Chunks to be overwritten are evicted and that
        eviction durable before a byte of them changes (committed ahead by the
        background commits once the ring is full, else committed here, waiting); ``on_evict(chunk)``
        lets the caller drop what it derived from them (priorities).
        """
        self.check()
        n = len(steps)
        segments, evict = self.ring.plan(n)
        self._largest_batch = max(self._largest_batch, n)
        if evict:
            # every commit since the one that planned a chunk's eviction records it too
            ahead = self._evictions_durable(evict)
            if not ahead and all(c in self._planned for c in evict) and self._inflight is not None:
                self.settle()  # the commit in flight records them: wait for it, not for two more syncs
                ahead = self._evictions_durable(evict)
            for chunk in evict:
                self.ring.evict(chunk)
                self._planned.pop(chunk, None)
                self.streams = {k: v for k, v in self.streams.items()
                                if v[0] // self.layout.chunk_rows != chunk}
                if on_evict is not None:
                    on_evict(chunk)
            if not ahead:
                self.eviction_waits += 1
                self.commit()
        slots = self.ring.apply(segments, steps.source)
        try:
            self._write_rows(steps, segments, slots)
        except BaseException as err:  # the ring counts rows that may not be on disk: for good
            self._writer.fail(err)
            raise
        if self.pending_rows == 0:
            self._pending_since = time.monotonic()
        self.pending_rows += n
        self.rows_added += n
        if seq is not None:
            self._pending_seqs[int(steps.actor_id[0])] = int(seq)
        return slots

    def _write_rows(self, steps: Steps, segments: list, slots: np.ndarray) -> None:
        """Pack and write the rows the ring just placed at ``slots``, and link the stream."""
        n = len(steps)
        self._plan_eviction()  # a chunk ahead of need: the next commits record it
        arrays = steps.arrays()
        direct = self._direct if all(as_stored(arrays[f], self.dtype.fields[f][0]) for f in self._direct) else ()
        staging = self._writer.staging(n)
        rows = to_rows(steps, self.dtype, staging, skip=direct, arrays=arrays, links=False)
        first_generation = self._link_rows(rows, steps.final, segments, slots)
        writes, i = [], 0
        for chunk, offset, count in segments:
            slot = chunk * self.layout.chunk_rows + offset
            if direct:
                writes.extend(row_vectors(staging, arrays, self._pieces, i, count, slot * self.row_bytes))
            else:
                writes.append((memoryview(rows[i:i + count]).cast("B"), slot * self.row_bytes))
            i += count
        self._writer.write(writes, staging)
        self._link_stream(steps, int(slots[0]), first_generation, int(slots[-1]))

    def _link_rows(self, rows: np.ndarray, final: np.ndarray, segments: list, slots: np.ndarray) -> int:
        """Each packed row's (next_index, next_generation): the next row of the batch, none after the
        last or after a final row (an episode ends there). Returns the first row's generation."""
        next_index, next_generation = rows[NEXT_INDEX], rows[NEXT_GENERATION]
        next_index[:-1] = slots[1:]
        next_index[-1] = next_generation[-1] = -1
        if len(segments) == 1:  # the common batch: one chunk, one generation
            first = int(self.ring.generation[segments[0][0]])
            next_generation[:-1] = first
        else:
            generation = self.ring.generation[slots // self.layout.chunk_rows]
            first = int(generation[0])
            next_generation[:-1] = generation[1:]
        ends = final[:-1]
        if ends.any():
            next_index[:-1][ends] = -1
            next_generation[:-1][ends] = -1
        return first

    def _evictions_durable(self, chunks: list[int]) -> bool:
        durable = self.durable_commits
        return all(self._planned.get(c, durable + 1) <= durable for c in chunks)

    def _link_stream(self, steps: Steps, first: int, generation: int, last: int) -> None:
        stream = (int(steps.actor_id[0]), int(steps.device_id[0]))
        prev = self.streams.pop(stream, None)
        if prev is not None:
            slot, episode, step = prev
            if episode == int(steps.episode_id[0]) and step + 1 == int(steps.step_index[0]):
                self._write_link(slot, first, generation)
        if not steps.final[-1]:
            self.streams[stream] = (last, int(steps.episode_id[-1]), int(steps.step_index[-1]))

    def _write_link(self, slot: int, successor: int, generation: int) -> None:
        """Patch a stored row's (next_index, next_generation), adjacent at the row's start
        (after the row itself: through the writer's queue while it has writes waiting)."""
        self._writer.patch(_LINK.pack(successor, generation), slot * self.row_bytes)

    def fileno(self) -> int:
        """The data file's descriptor (for reads that bypass the mapping, e.g. a prefetching preadv)."""
        return self._fd

    @property
    def rows(self) -> np.ndarray:
        """Every row slot (read-only mapping), once the writes submitted so far have landed."""
        self.check()
        self._writer.drain()
        return self._rows

    def drain_writes(self) -> None:
        """Wait for the writer thread's queued writes; raise a failed one's error."""
        self.check()
        self._writer.drain()

    def close(self, commit: bool = True) -> None:
        """Commit what is pending (unless ``commit`` is False: as a crash would) and unmap.

        The files close even if the commit fails (its error is raised; the
        store is closed either way), except while the writer thread still
        writes past its deadline: then TimeoutError, and the file stays open
        for it (close again later). With ``commit``, a row write that failed
        earlier is raised here too.
        """
        if self._fd < 0:
            return
        try:
            if commit and (self.pending_rows or self._writer.failure is not None):
                self.commit()
            else:
                self.settle()
        finally:
            if self._committer is not None:
                self._committer.shutdown(wait=True)
                self._committer = None
            self._writer.close()  # its queued writes land before the file closes (or it raises)
            self._rows = None
            with contextlib.suppress(BufferError):  # a caller holds a view: unmapped with the last one
                self._mmap.close()
            os.close(self._fd)
            for fd in self._index_fds:
                os.close(fd)
            self._fd = -1
