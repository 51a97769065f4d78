"""A run's ``metrics.jsonl``: the learner writes a record each second; the operator console appends
its own rows (each action, the actors' success rate), marked ``"source": "console"``. Readers of the
learner's records read them here, without JAX."""

from __future__ import annotations

import json
from pathlib import Path

CONSOLE = "console"
"""The ``source`` of the console's rows."""


def is_learner_record(record) -> bool:
    """Whether a parsed ``metrics.jsonl`` line is one of the learner's records."""
    return isinstance(record, dict) and record.get("source") != CONSOLE


def learner_records(run_dir: str | Path) -> list[dict]:
    """The learner's records in ``run_dir/metrics.jsonl``, oldest first (a line cut short, as a
    crash or a write in progress leaves it, is left out)."""
    records = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if is_learner_record(record):
            records.append(record)
    return records
