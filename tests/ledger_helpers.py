"""Exactly-once, checked from the outside: the actors' batch ledgers against the replay."""

from __future__ import annotations

import json
import subprocess
import sys


def exactly_once(run_dir, actors: int) -> None:
    """Each actor's ledger = the replay's rows of that actor + what its spool still holds (batches
    sent as the learner said goodbye): equal rows and digests, so every row arrived once."""
    from embodyrl.hal.ledger import DIGEST_MOD, read_ledger
    from embodyrl.hal.wire.spool import Spool

    report = json.loads(subprocess.run([sys.executable, "-m", "embodyrl.cli", "replay", str(run_dir), "--json"],
                                       capture_output=True, text=True, timeout=60, check=True).stdout)
    for index in range(actors):
        pending = set(Spool(run_dir / "spools" / f"actor-{index}").seqs())
        delivered = [entry for seq, entry in read_ledger(run_dir / f"actor-{index}.ledger.jsonl").items()
                     if seq not in pending]
        rows, digest = sum(r for r, _ in delivered), sum(d for _, d in delivered) % DIGEST_MOD
        assert rows > 0, index
        assert (report["rows_by_actor"][str(index)], report["digest_by_actor"][str(index)]) == (rows, digest), index
