"""A run's ``metrics.jsonl``: the learner writes a record each second; the operator console appends
its own rows (each action, the actors' success rate), marked ``"source": "console"``. Readers of the
learner's records read them here, without JAX, from a run directory or from the artifacts a
documented result keeps (:func:`keep_artifacts`: ``metrics.jsonl`` gzipped when large)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

ARTIFACTS = ("config.json", "summary.json", "metrics.jsonl")
"""What makes a learning result checkable: its settings, its final figures and its curves."""
COMPRESS_ABOVE_BYTES = 256 * 1024
"""``metrics.jsonl`` larger than this is kept as ``metrics.jsonl.gz``."""

CONSOLE = "console"
"""The ``source`` of the console's rows."""


def is_learner_record(record) -> bool:
    """Whether a parsed ``metrics.jsonl`` line is one of the learner's records."""
    return isinstance(record, dict) and record.get("source") != CONSOLE


def learner_records(run_dir: str | Path) -> list[dict]:
    """The learner's records in ``run_dir/metrics.jsonl``, oldest first (a line cut short, as a
    crash or a write in progress leaves it, is left out)."""
    records = []
    for line in metrics_text(run_dir).splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if is_learner_record(record):
            records.append(record)
    return records


def metrics_text(run_dir: str | Path) -> str:
    """``run_dir``'s ``metrics.jsonl``, or its kept ``metrics.jsonl.gz``."""
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists():
        return path.read_text()
    packed = path.with_name("metrics.jsonl.gz")
    if packed.exists():
        return gzip.decompress(packed.read_bytes()).decode()
    raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (not a run directory?)")


def missing_artifacts(directory: str | Path) -> list[str]:
    """The :data:`ARTIFACTS` ``directory`` lacks (each one may also be there gzipped)."""
    directory = Path(directory)
    return [name for name in ARTIFACTS if not (directory / name).exists() and not (directory / f"{name}.gz").exists()]


def has_artifacts(directory: str | Path) -> bool:
    """Whether ``directory`` holds a run's :data:`ARTIFACTS` (``metrics.jsonl`` possibly gzipped)."""
    return not missing_artifacts(directory)


def keep_artifacts(run_dirs, into: str | Path) -> list[Path]:
    """Copy each run's :data:`ARTIFACTS` into ``into``, each run under its path below the runs'
    common parent (``sweep/s0`` and ``other/s0`` stay apart; one run keeps its own name); the
    replay, policy and checkpoints stay behind. Returns the folders written. A run without one of
    them is refused before anything is copied: a result kept without its summary could not be checked."""
    into = Path(into)
    sources = [Path(r).resolve() for r in run_dirs]
    for run_dir in sources:
        missing = missing_artifacts(run_dir)
        if missing:
            raise FileNotFoundError(f"{run_dir}: no {', '.join(missing)} to keep (a finished run has them)")
    parent = Path(os.path.commonpath([run_dir.parent for run_dir in sources]))
    kept = []
    for run_dir in sources:
        target = into / run_dir.relative_to(parent)
        kept.append(target)
        if target.resolve() == run_dir:
            continue  # already kept: re-plotting from the artifacts
        target.mkdir(parents=True, exist_ok=True)
        for stale in ("metrics.jsonl", "metrics.jsonl.gz"):
            (target / stale).unlink(missing_ok=True)
        for name in ARTIFACTS[:2]:
            shutil.copyfile(run_dir / name, target / name)
        data = metrics_text(run_dir).encode()
        if len(data) > COMPRESS_ABOVE_BYTES:
            (target / "metrics.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (target / "metrics.jsonl").write_bytes(data)
    return kept


def kept_runs(directory: str | Path) -> list[Path]:
    """The run folders below ``directory`` (any folder holding one of :data:`ARTIFACTS`)."""
    directory = Path(directory)
    found = {path.parent for name in ARTIFACTS for pattern in (name, f"{name}.gz")
             for path in directory.rglob(pattern)}
    return sorted(found)
