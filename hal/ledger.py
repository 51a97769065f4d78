"""The actor's ledger: one line per batch its link took, for auditing exact-once delivery.

Each line is ``{"seq", "rows", "digest"}`` (see :func:`~.steps.rows_digest`),
appended after the batch is in the spool. An actor killed between the two
writes leaves a spooled batch without a line; :meth:`BatchLedger.reconcile`
adds it from the spool when the actor restarts on the same spool directory,
so the ledger always names exactly the batches the learner will receive.
Compare the summed ledger with the replay's ``digest_by_actor`` (``embodyrl
replay DIR --json``): equal rows and digest means every row arrived once.
"""

from __future__ import annotations

import json
from pathlib import Path

from .steps import rows_digest
from .wire.codec import decode

DIGEST_MOD = 1 << 64


class BatchLedger:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = self.path.exists() and self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n")
        self._file = self.path.open("a")
        if torn:  # a kill mid-line: end it, so the next line is whole
            self._file.write("\n")

    def record(self, seq: int, steps) -> None:
        self._write(seq, len(steps), rows_digest(steps))

    def reconcile(self, spool) -> int:
        """Add the spooled batches this ledger lacks (a kill between spool and ledger); how many."""
        known = read_ledger(self.path)
        added = 0
        for seq in spool.seqs():
            if seq not in known:
                msg = decode(spool.frames(seq))  # our own spool, written by this actor's link
                self._write(seq, spool.rows_of(seq), rows_digest(msg.arrays))
                added += 1
        return added

    def _write(self, seq: int, rows: int, digest: int) -> None:
        self._file.write(json.dumps({"seq": seq, "rows": rows, "digest": digest}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_ledger(path: str | Path) -> dict[int, tuple[int, int]]:
    """seq -> (rows, digest); a line torn by a kill is skipped (its batch is reconciled later)."""
    entries: dict[int, tuple[int, int]] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return entries
    for line in lines:
        try:
            item = json.loads(line)
            entries[int(item["seq"])] = (int(item["rows"]), int(item["digest"]))
        except (ValueError, KeyError, TypeError):
            continue
    return entries


def ledger_totals(path: str | Path) -> tuple[int, int]:
    """(rows, digest) of everything the ledger names."""
    entries = read_ledger(path).values()
    return sum(r for r, _ in entries), sum(d for _, d in entries) % DIGEST_MOD
