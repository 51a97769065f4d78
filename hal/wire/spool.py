"""The actor's spool: step batches sent but not yet acknowledged, in order.

Every batch is held until the learner acknowledges it (ACK means the replay
committed it), so nothing is lost across a dead link or a learner restart.
Batches live in RAM up to ``ram_bytes``; with a directory they are also
written through to one file each (page cache, no fsync: it survives the
actor process dying, not the machine losing power), and an actor restarted
on the same directory resends what it finds there. When the disk budget is
spent the spool either refuses new batches (``on_full="pause"``: the caller
puts its devices in their safe state) or drops the oldest and counts them
(``on_full="drop_oldest"``). It never blocks.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections import OrderedDict
from pathlib import Path

_SUFFIX = ".batch"
_RUN_FILE = "run"
_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")


class SpoolFull(RuntimeError):
    """The spool's disk budget is spent and its policy is to pause."""


class Spool:
    def __init__(self, directory: str | Path | None = None, *, ram_bytes: int = 256 << 20,
                 disk_bytes: int = 8 << 30, on_full: str = "pause"):
        if on_full not in ("pause", "drop_oldest"):
            raise ValueError(f"on_full must be 'pause' or 'drop_oldest', got {on_full!r}")
        self.directory = Path(directory) if directory is not None else None
        self.ram_bytes = ram_bytes
        self.disk_bytes = disk_bytes
        self.on_full = on_full
        self._batches: OrderedDict[int, tuple[int, list[bytes] | None]] = OrderedDict()  # seq -> (rows, frames|None)
        self._sizes: dict[int, int] = {}
        self._cumulative: dict[int, int] = {}  # seq -> rows pushed up to and including it (since creation)
        self._rows_pushed = 0
        self._rows = 0
        self.bytes_in_ram = 0
        self.bytes_total = 0
        self.dropped_batches = 0
        self.dropped_rows = 0
        self._run: str | None = None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._recover()
            with contextlib.suppress(FileNotFoundError):
                self._run = (self.directory / _RUN_FILE).read_text() or None

    # -- queries ---------------------------------------------------------
    def __len__(self) -> int:
        return len(self._batches)

    @property
    def rows(self) -> int:
        return self._rows

    def rows_after(self, seq: int) -> int:
        """Rows of the batches after ``seq`` (what is still unsent when ``seq`` was the last sent):
        O(1), so a long outage's spool costs nothing per send."""
        if not self._batches or seq >= self.last_seq:
            return 0
        if seq < self.first_seq:
            return self._rows
        if seq in self._cumulative:
            return self._cumulative[self.last_seq] - self._cumulative[seq]
        return sum(self._batches[s][0] for s in self._batches if s > seq)  # a gap left by a corrupt file

    def seqs_after(self, seq: int):
        """The spooled seqs after ``seq``, in order, without walking the ones before it."""
        if not self._batches:
            return
        for s in range(max(seq + 1, self.first_seq), self.last_seq + 1):
            if s in self._batches:
                yield s

    @property
    def last_seq(self) -> int:
        return next(reversed(self._batches)) if self._batches else 0

    def seqs(self) -> list[int]:
        return list(self._batches)

    @property
    def first_seq(self) -> int:
        return next(iter(self._batches)) if self._batches else 0

    def size_of(self, seq: int) -> int:
        """Bytes of one batch as sent."""
        return self._sizes[seq]

    def rows_of(self, seq: int) -> int:
        return self._batches[seq][0]

    def frames(self, seq: int) -> list[bytes]:
        rows, frames = self._batches[seq]
        return frames if frames is not None else self._read(seq)[1]

    @property
    def run(self) -> str | None:
        """The run whose learner numbered these batches (its WELCOME's ``run_id``; kept beside the
        batches): another run's acknowledgements say nothing about them."""
        return self._run

    @run.setter
    def run(self, run_id: str) -> None:
        if run_id != self._run and self.directory is not None:
            tmp = self.directory / f".{_RUN_FILE}.tmp"
            tmp.write_text(run_id)
            os.replace(tmp, self.directory / _RUN_FILE)
        self._run = run_id

    # -- changes ---------------------------------------------------------
    def push(self, seq: int, rows: int, frames: list) -> None:
        """Hold a batch until it is acknowledged; raise SpoolFull if paused."""
        if self._batches and seq <= self.last_seq:
            raise ValueError(f"seq {seq} is not after {self.last_seq}")
        frames = list(frames)  # held by reference: encoded frames are never written to again
        size = sum(memoryview(f).nbytes for f in frames)
        if self.bytes_total + size > self.disk_bytes:
            if self.on_full == "pause":
                raise SpoolFull(f"spool holds {self.bytes_total} bytes of unacknowledged steps; "
                                f"its budget is {self.disk_bytes} bytes")
            while self._batches and self.bytes_total + size > self.disk_bytes:
                old = next(iter(self._batches))
                self.dropped_batches += 1
                self.dropped_rows += self._batches[old][0]
                self._forget(old)
        if self.directory is not None:
            self._write(seq, rows, frames)
        keep = self.bytes_in_ram + size <= self.ram_bytes or self.directory is None
        self._batches[seq] = (rows, frames if keep else None)
        self._count(seq, rows, size)
        if keep:
            self.bytes_in_ram += size

    def _count(self, seq: int, rows: int, size: int) -> None:
        self._sizes[seq] = size
        self.bytes_total += size
        self._rows += rows
        self._rows_pushed += rows
        self._cumulative[seq] = self._rows_pushed

    def ack(self, seq: int) -> None:
        """Forget every batch up to and including ``seq``."""
        while self._batches and next(iter(self._batches)) <= seq:
            self._forget(next(iter(self._batches)))

    def _forget(self, seq: int) -> None:
        rows, frames = self._batches.pop(seq)
        size = self._sizes.pop(seq)
        del self._cumulative[seq]
        self._rows -= rows
        self.bytes_total -= size
        if frames is not None:
            self.bytes_in_ram -= size
        if self.directory is not None:
            self._path(seq).unlink(missing_ok=True)

    # -- files -----------------------------------------------------------
    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:016d}{_SUFFIX}"

    def _write(self, seq: int, rows: int, frames: list[bytes]) -> None:
        tmp = self.directory / f".{seq:016d}.tmp"
        with open(tmp, "wb") as f:
            f.write(_COUNT.pack(rows))
            f.write(_COUNT.pack(len(frames)))
            for frame in frames:
                f.write(_LENGTH.pack(len(frame)))
                f.write(frame)
        os.replace(tmp, self._path(seq))

    def _read(self, seq: int) -> tuple[int, list[bytes]]:
        data = self._path(seq).read_bytes()
        (rows,) = _COUNT.unpack_from(data, 0)
        (count,) = _COUNT.unpack_from(data, 4)
        offset, frames = 8, []
        for _ in range(count):
            (length,) = _LENGTH.unpack_from(data, offset)
            offset += _LENGTH.size
            if offset + length > len(data):
                raise ValueError(f"{self._path(seq)} is truncated")
            frames.append(data[offset:offset + length])
            offset += length
        return rows, frames

    def _recover(self) -> None:
        for tmp in self.directory.glob(".*.tmp"):
            tmp.unlink()  # a write the actor did not finish: never renamed, never counted
        for path in sorted(self.directory.glob(f"*{_SUFFIX}")):
            seq = int(path.stem)
            try:
                rows, frames = self._read(seq)
            except (ValueError, struct.error):
                path.rename(path.with_suffix(".corrupt"))
                continue
            size = sum(len(f) for f in frames)
            keep = self.bytes_in_ram + size <= self.ram_bytes
            self._batches[seq] = (rows, frames if keep else None)
            self._count(seq, rows, size)
            if keep:
                self.bytes_in_ram += size
