"""The replay's small files: the CRC-checked commit index and atomically replaced metadata.

An index file is ``%015d`` and a newline (the header's length), a JSON header
``{"crc32", "length"}`` and the JSON body: a torn write fails the CRC or
the length, so a reader can tell it from a complete commit.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a crash leaves the old or the new file, whole."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def encode_index(body: dict) -> bytes:
    """One commit's bytes: length-prefixed header with the body's CRC, then the body."""
    text = json.dumps(body, separators=(",", ":")).encode()
    header = json.dumps({"crc32": zlib.crc32(text), "length": len(text)}).encode()
    return b"%015d\n" % len(header) + header + text


def read_index(path: Path) -> dict | None:
    """The commit in ``path``; None if empty; raises ValueError if torn or corrupt."""
    raw = path.read_bytes() if path.exists() else b""
    if not raw:
        return None
    try:
        n = int(raw[:15])
        header = json.loads(raw[16:16 + n])
        text = raw[16 + n:16 + n + header["length"]]
        if len(text) != header["length"] or zlib.crc32(text) != header["crc32"]:
            raise ValueError("checksum or length mismatch")
        return json.loads(text)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path.name}: {err}") from None
