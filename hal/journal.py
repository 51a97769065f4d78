"""Write-ahead of recorded rows: what an actor stepped but has not yet put into its spool.

A device's recorder gathers rows until a batch is full (``actor.send_every``) or the learner's
credit allows sending it; only then does the batch enter the spool, whose file survives the
actor. Without this journal, a SIGKILL between the two loses the rows recorded since the last
batch. With it, each row is appended to ``device-ID.rows`` in the spool directory as it is
recorded (one ``write``, page cache, no fsync: like the spool, it survives the process, not the
machine), the file is emptied once the batch is spooled, and an actor restarted on the same
spool sends what it finds first.

A record is the recorder's row exactly (one numpy structured dtype, every column of
:class:`~.steps.Steps` by its wire name), so writing it costs one system call and no encoding.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import numpy as np

from .wire.codec import decode

_MAGIC = b"embodyrl row journal 1\n"


def journal_path(directory: Path, device_id: int) -> Path:
    return directory / f"device-{device_id}.rows"


class RowJournal:
    """The append-only file of one device's rows since its last spooled batch.

    ``recovered`` holds the rows a previous process left (a structured array, possibly empty).
    A journal written for other columns (the robot file changed between runs) is moved aside as
    ``NAME.stale-TIME`` with a warning, never overwritten; a torn last record (killed mid-write)
    is dropped, as a spool drops an unfinished batch file.
    """

    def __init__(self, path: str | Path, dtype: np.dtype):
        self._fd = -1
        self.path = Path(path)
        self.dtype = dtype
        self._header = _MAGIC + repr(dtype.descr).encode() + b"\n"
        self.recovered = self._read_previous()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        if not len(self.recovered):  # a fresh file, or one a previous process emptied: the header only
            self.clear()

    def _read_previous(self) -> np.ndarray:
        empty = np.zeros(0, self.dtype)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return empty
        if not data.startswith(self._header):
            if data:
                aside = self.path.with_name(f"{self.path.name}.stale-{time.strftime('%Y%m%dT%H%M%S')}")
                os.replace(self.path, aside)
                warnings.warn(f"{self.path} holds rows of other columns (the device's specs changed); "
                              f"kept as {aside}, not sent", stacklevel=3)
            return empty
        body = memoryview(data)[len(self._header):]
        whole = len(body) // self.dtype.itemsize
        return np.frombuffer(body[:whole * self.dtype.itemsize], self.dtype).copy()

    def append(self, rows: np.ndarray) -> None:
        """Append records (a slice of the recorder's table): one ``write``."""
        os.write(self._fd, rows.data)

    def clear(self) -> None:
        """Forget every record: the rows are in the spool now."""
        os.ftruncate(self._fd, 0)
        os.write(self._fd, self._header)
        self.recovered = np.zeros(0, self.dtype)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    __del__ = close


def already_spooled(spool, device_id: int, recovered) -> bool:
    """Whether the spool's newest batch of ``device_id`` ends with the ``recovered`` batch's last row
    (its ``episode_id`` and ``step_index``): the process died after spooling a batch and before
    emptying the journal, so the journal's rows are in the spool already."""
    for seq in reversed(spool.seqs()):
        message = decode(spool.frames(seq))
        if message.fields.get("device_id") != device_id:
            continue
        episodes, steps = message.arrays["episode_id"], message.arrays["step_index"]
        return (int(episodes[-1]), int(steps[-1])) == (int(recovered.episode_id[-1]), int(recovered.step_index[-1]))
    return False
