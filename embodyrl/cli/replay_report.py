"""``embodyrl replay DIR``: what a persistent replay holds, read without changing a byte.

Opening a replay with :class:`PersistentReplay` is a reopen: it may repair the
links of open episodes, which a tool that only looks must not do (a learner may
be writing the same directory). This module reads ``meta.json``, the newer of
the two committed indexes and the committed rows of ``data.bin`` through a
read-only mapping, so it reports exactly what a reopen would see.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from ..hal.steps import Source, rows_digest
from ..replay.contents import newest_commit
from ..replay.layout import DATA_FILE, META_FILE, SHARDS_FILE, Layout
from ..replay.ring import ChunkRing

_IDENTITY = ("actor_id", "device_id", "episode_id", "step_index")
"""The columns of a row's identity, digested as the actor's ledger digests them."""


def replay_directory(path: Path) -> Path:
    """``path`` itself when it holds a replay, else its ``replay/`` (a run directory)."""
    path = Path(path)
    for candidate in (path, path / "replay"):
        if (candidate / META_FILE).exists():
            return candidate
    raise FileNotFoundError(f"{path}: no replay here (neither {META_FILE} nor replay/{META_FILE})")


def _source_name(value: int) -> str:
    try:
        return Source(value).name.lower()
    except ValueError:
        return f"source_{value}"


def replay_directories(path: Path) -> list[Path]:
    """The replays of ``path``: its ingest workers' shards (``replay/shard-K``), else the one replay."""
    path = Path(path)
    for candidate in (path, path / "replay"):
        if (candidate / SHARDS_FILE).exists():
            count = json.loads((candidate / SHARDS_FILE).read_text())["shards"]
            return [candidate / f"shard-{k}" for k in range(count) if (candidate / f"shard-{k}" / META_FILE).exists()]
    return [replay_directory(path)]


def inspect(path: Path) -> dict:
    """Size, capacity, chunks, rows by source and by actor (with their digest), policy versions, committed seqs;
    over every shard of a replay that ingest workers wrote."""
    directories = replay_directories(path)
    if len(directories) == 1:
        return _inspect(directories[0])
    return _merged([_inspect(d) for d in directories])


_SUMMED = ("size", "capacity", "chunks", "chunks_used", "chunks_pinned", "commits", "rows_added", "episodes_complete")
_JOINED = ("rows_by_actor", "digest_by_actor", "committed_seqs")  # an actor's rows live in one shard


def _merged(reports: list[dict]) -> dict:
    """One report of several shards' (sums, and each actor's figures from the shard that holds it)."""
    merged = {**reports[0], "directory": [r["directory"] for r in reports], "shards": len(reports)}
    for key in _SUMMED:
        merged[key] = sum(r[key] for r in reports)
    for key in _JOINED:
        merged[key] = {k: v for r in reports for k, v in r[key].items()}
    for key in ("rows_by_source", "rows_by_policy_version"):
        total = Counter()
        for r in reports:
            total.update(r[key])
        merged[key] = dict(sorted(total.items()))
    counts = [r[k] for r in reports for k in ("policy_count_min", "policy_count_max") if r[k] is not None]
    merged["policy_versions"] = len(merged["rows_by_policy_version"])
    merged["policy_count_min"], merged["policy_count_max"] = (min(counts), max(counts)) if counts else (None, None)
    merged["policy_incarnations"] = sorted({i for r in reports for i in r["policy_incarnations"]})
    return merged


def _inspect(directory: Path) -> dict:
    layout = Layout.from_json((directory / META_FILE).read_text(), str(directory / META_FILE))
    ring = ChunkRing(layout.chunks, layout.chunk_rows)
    body = newest_commit(directory)
    if body is not None:
        ring.load(body["ring"])
    rows = np.memmap(directory / DATA_FILE, layout.dtype, mode="r", shape=(layout.capacity,))
    by_source, by_actor, versions, digests = Counter(), Counter(), Counter(), Counter()
    episodes = set()
    for chunk in np.flatnonzero(ring.fill):
        base = int(chunk) * layout.chunk_rows
        part = rows[base:base + int(ring.fill[chunk])]
        by_source.update(dict(zip(*np.unique(part["source"], return_counts=True), strict=True)))
        by_actor.update(dict(zip(*np.unique(part["actor_id"], return_counts=True), strict=True)))
        for actor in np.unique(part["actor_id"]):
            mine = part[part["actor_id"] == actor]
            digests[int(actor)] = (digests[int(actor)] + rows_digest({k: mine[k] for k in _IDENTITY})) % (1 << 64)
        pairs = np.stack([part["policy_incarnation"], part["policy_count"]], axis=1)
        unique, counts = np.unique(pairs, axis=0, return_counts=True)
        versions.update({(int(i), int(c)): int(n) for (i, c), n in zip(unique, counts, strict=True)})
        finals = part["final"].astype(bool)
        episodes.update(zip(part["actor_id"][finals].tolist(), part["device_id"][finals].tolist(),
                            part["episode_id"][finals].tolist(), strict=True))
    del rows
    counts = [v[1] for v in versions]
    return {
        "directory": str(directory),
        "size": ring.size,
        "capacity": layout.capacity,
        "chunk_rows": layout.chunk_rows,
        "chunks": layout.chunks,
        "chunks_used": int(np.count_nonzero(ring.fill)),
        "chunks_pinned": int(np.count_nonzero(ring.pinned)),
        "row_bytes": layout.dtype.itemsize,
        "commits": int(body["commit"]) if body else 0,
        "rows_added": int(body["rows_added"]) if body else 0,
        "episodes_complete": len(episodes),
        "rows_by_source": {_source_name(int(s)): int(n) for s, n in sorted(by_source.items())},
        "rows_by_actor": {str(int(a)): int(n) for a, n in sorted(by_actor.items())},
        "digest_by_actor": {str(a): d for a, d in sorted(digests.items())},
        "policy_versions": len(versions),
        "policy_count_min": min(counts) if counts else None,
        "policy_count_max": max(counts) if counts else None,
        "policy_incarnations": sorted({v[0] for v in versions}),
        "rows_by_policy_version": {f"{i}:{c}": n for (i, c), n in sorted(versions.items())},
        "committed_seqs": {str(a): int(q) for a, q in sorted(
            ((int(a), q) for a, q in (body or {}).get("actor_seqs", {}).items()))},
        "observation_spec": list(layout.observation_spec),
    }


def format_report(report: dict) -> str:
    """The report as aligned lines for a terminal (the long per-version table summarised)."""
    shown = {k: v for k, v in report.items() if k != "rows_by_policy_version"}
    width = max(len(k) for k in shown)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in shown.items())
