"""The on-disk record: one fixed-size row per step, every field of the step record in it.

The data file is one array of rows of a numpy structured dtype (row-major):
a uniform random gather is one fancy-index over that array, after which
every field is a view. Rows of the same stream are usually adjacent, so a
row and its successor share a page and a cold gather reads about one page
per sampled row, not one page per field (a file per field reads ~17 pages
per row, a separate array per chunk makes hot gathers ~10x slower).

``next_index`` (the successor's row slot, -1 until it arrives or for final
rows) and ``next_generation`` (the generation of the successor's chunk when
the link was made) sit in the row too: the store patches both in place when
the successor arrives. The next observation is thus an index, never a copy,
and a link is valid while that chunk still has that generation: checking it
reads only the row itself and the ring in RAM, never the successor row.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import OBSERVATION_PREFIX, SCALAR_COLUMNS, Steps

FORMAT_VERSION = 2
META_FILE = "meta.json"
SHARDS_FILE = "shards.json"
"""Beside the shards ``shard-K`` of a replay that ingest workers write: how many there are."""
DATA_FILE = "data.bin"
INDEX_FILES = ("index-0", "index-1")
NEXT_INDEX = "next_index"
NEXT_GENERATION = "next_generation"


def row_dtype(observation_spec: DictSpec, action_spec: ArraySpec) -> np.dtype:
    """The structured dtype of one stored row, 8-byte aligned so patches are aligned."""
    fields: list[tuple] = [(NEXT_INDEX, np.int64), (NEXT_GENERATION, np.int64)]
    for name, spec in observation_spec.items():
        fields.append((OBSERVATION_PREFIX + name, np.dtype(spec.dtype), tuple(spec.shape)))
    fields.append(("action", np.dtype(action_spec.dtype), tuple(action_spec.shape)))
    fields.append(("proposed_action", np.dtype(action_spec.dtype), tuple(action_spec.shape)))
    fields.extend((name, dtype) for name, dtype in SCALAR_COLUMNS.items())
    dtype = np.dtype(fields, align=True)
    pad = -dtype.itemsize % 8
    if pad:
        dtype = np.dtype({"names": dtype.names, "formats": [dtype.fields[n][0] for n in dtype.names],
                          "offsets": [dtype.fields[n][1] for n in dtype.names],
                          "itemsize": dtype.itemsize + pad})
    return dtype


def to_rows(steps: Steps, dtype: np.dtype, out: np.ndarray | None = None,
            skip: tuple[str, ...] = (), *, arrays: dict | None = None, links: bool = True) -> np.ndarray:
    """Pack a batch of steps into rows (``next_index`` left at -1; without ``links``, left for the
    caller to write).

    ``out`` (zeroed once, at least ``len(steps)`` rows of ``dtype``) is reused:
    every field is written, so its padding stays zero and no fresh pages are
    faulted in per batch. Fields in ``skip`` are left as they are (the store
    writes those straight from their columns, see :func:`row_pieces`).
    ``arrays``: ``steps.arrays()``, where the caller holds it already."""
    rows = np.zeros(len(steps), dtype) if out is None else out[:len(steps)]
    if links:
        rows[NEXT_INDEX] = -1
        rows[NEXT_GENERATION] = -1
    for name, column in (steps.arrays() if arrays is None else arrays).items():
        if name not in skip:
            rows[name] = column
    return rows


DIRECT_FIELD_BYTES = 4096
"""Fields at least this large per row (camera images) are written from their own column."""


def direct_fields(dtype: np.dtype) -> tuple[str, ...]:
    """The fields the store writes straight from the received column (one copy, not two)."""
    return tuple(name for name in dtype.names if dtype.fields[name][0].itemsize >= DIRECT_FIELD_BYTES)


def row_pieces(dtype: np.dtype, direct: tuple[str, ...]) -> list[tuple[str | None, int, int]]:
    """One row as byte pieces in file order: ``(None, start, end)`` from the packed row,
    ``(field, 0, nbytes)`` from that field's column; adjacent packed pieces merged."""
    pieces: list[tuple[str | None, int, int]] = []
    cursor = 0
    for name, offset in sorted(((n, dtype.fields[n][1]) for n in direct), key=lambda x: x[1]):
        if offset > cursor:
            pieces.append((None, cursor, offset))
        size = dtype.fields[name][0].itemsize
        pieces.append((name, 0, size))
        cursor = offset + size
    if cursor < dtype.itemsize:
        pieces.append((None, cursor, dtype.itemsize))
    return pieces


def as_stored(column: np.ndarray, field: np.dtype) -> bool:
    """The column's bytes are the field's bytes, row after row (no conversion needed)."""
    return column.dtype == field.base and column.shape[1:] == field.shape and column.flags.c_contiguous


_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def row_vectors(staging: np.ndarray, arrays: dict, pieces: list, first: int, count: int,
                position: int) -> list[tuple[list[memoryview], int, int]]:
    """``pwritev`` calls (buffers, file offset, bytes) for rows ``first..first+count`` at file
    offset ``position``: the large fields straight from their columns, and between them one
    slice of ``staging`` each (a row's packed tail and the next row's packed head are adjacent
    there, so one slice covers both)."""
    packed = memoryview(staging).cast("B")
    direct = [(memoryview(arrays[name]).cast("B"), a, b) for name, a, b in _direct_spans(pieces)]
    rb = staging.dtype.itemsize
    per_call = max(1, (_IOV_MAX - 1) // (2 * len(direct)))
    out = []
    for start in range(first, first + count, per_call):
        stop = min(start + per_call, first + count)
        views, cursor = [], start * rb
        for r in range(start, stop):
            for column, offset, size in direct:
                if r * rb + offset > cursor:
                    views.append(packed[cursor:r * rb + offset])
                views.append(column[r * size:(r + 1) * size])
                cursor = r * rb + offset + size
        if stop * rb > cursor:
            views.append(packed[cursor:stop * rb])
        out.append((views, position + (start - first) * rb, (stop - start) * rb))
    return out


def _direct_spans(pieces: list) -> list[tuple[str, int, int]]:
    """(field, offset in the row, size) of the direct pieces of ``row_pieces``."""
    spans, offset = [], 0
    for name, a, b in pieces:
        if name is not None:
            spans.append((name, offset, b))
        offset += b - a
    return spans


@dataclass(frozen=True)
class Layout:
    """What a replay directory holds; written once at creation, checked at every reopen."""

    capacity: int
    """Row slots in the data file."""
    chunk_rows: int
    """Rows per chunk: the unit of commits, eviction and cache policy."""
    observation_spec: DictSpec
    action_spec: ArraySpec

    @property
    def chunks(self) -> int:
        return self.capacity // self.chunk_rows

    @property
    def dtype(self) -> np.dtype:
        return row_dtype(self.observation_spec, self.action_spec)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT_VERSION, "capacity": self.capacity, "chunk_rows": self.chunk_rows,
            "observation_spec": self.observation_spec.to_msg(), "action_spec": self.action_spec.to_msg(),
            "row_bytes": self.dtype.itemsize,
        }, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> Layout:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err})") from None
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"{where}: format {data.get('format')!r}; this code reads {FORMAT_VERSION}")
        layout = cls(int(data["capacity"]), int(data["chunk_rows"]),
                     DictSpec.from_msg(data["observation_spec"]), ArraySpec.from_msg(data["action_spec"]))
        if layout.dtype.itemsize != data["row_bytes"]:
            raise ValueError(f"{where}: row_bytes {data['row_bytes']} differ from this code's "
                             f"{layout.dtype.itemsize}")
        return layout

    def validate(self) -> None:
        if self.chunk_rows < 2:
            raise ValueError(f"chunk_rows must be at least 2, got {self.chunk_rows}")
        if self.capacity % self.chunk_rows or self.capacity < 2 * self.chunk_rows:
            raise ValueError(f"capacity {self.capacity} must be a multiple of chunk_rows "
                             f"{self.chunk_rows} and hold at least two chunks")
