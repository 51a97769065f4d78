"""Weight encodings: full tensors, lossless sparse deltas, quantised full weights.

A policy's parameters travel as a flat ``name -> array`` map (see
:mod:`..params`). Three encodings:

* ``full``: the arrays as they are.
* ``delta``: against a base version the receiver holds, per array the
  positions whose *bits* changed and their new values, either as uint32
  indices or as a bitmask, whichever is smaller. Reconstruction is bit-exact
  (NaN payloads and -0.0 included) and verified with :func:`checksum`.
* ``bf16`` / ``int8``: lossy full weights for very slow links (int8 with one
  symmetric scale per tensor).

Measured, not assumed: a small fp32 policy trained with Adam changes nearly
every element each step (a delta is larger than the weights), a large policy
fine-tuned slowly in bf16 changes about 1% (a delta is ~50x smaller).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import ml_dtypes
import numpy as np

FULL, DELTA, BF16, INT8 = "full", "delta", "bf16", "int8"
ENCODINGS = (FULL, DELTA, BF16, INT8)
_SEP = "#"


class WeightsError(ValueError):
    """Weights that cannot be decoded: wrong base, missing arrays, checksum mismatch."""


def checksum(arrays: Mapping[str, np.ndarray]) -> str:
    """A digest of names, dtypes, shapes and bytes, independent of dict order."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
    return h.hexdigest()


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a).reshape(-1)
    if a.dtype.itemsize == 1:
        return a.view(np.uint8)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def encode_delta(base: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays describing ``new`` as changes to ``base`` (same names, shapes, dtypes)."""
    if set(base) != set(new):
        raise WeightsError(f"delta needs the same arrays: {sorted(set(base) ^ set(new))} differ")
    out: dict[str, np.ndarray] = {}
    for name, value in new.items():
        old = base[name]
        if old.shape != value.shape or old.dtype != value.dtype:
            raise WeightsError(f"{name}: {old.dtype}{old.shape} -> {value.dtype}{value.shape}")
        changed = _bits(old) != _bits(value)
        positions = np.flatnonzero(changed)
        values = np.ascontiguousarray(value).reshape(-1)[positions]
        index_bytes = positions.size * 4
        mask_bytes = (changed.size + 7) // 8
        if index_bytes <= mask_bytes:
            out[f"{name}{_SEP}idx"] = positions.astype(np.uint32)
        else:
            out[f"{name}{_SEP}mask"] = np.packbits(changed)
        out[f"{name}{_SEP}val"] = values
    return out


def apply_delta(base: Mapping[str, np.ndarray], delta: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rebuild the new arrays from ``base`` and a delta from :func:`encode_delta`."""
    out: dict[str, np.ndarray] = {}
    for name, old in base.items():
        flat = np.array(old, copy=True).reshape(-1)
        values = delta.get(f"{name}{_SEP}val")
        if values is None:
            raise WeightsError(f"{name}: delta has no values")
        if f"{name}{_SEP}idx" in delta:
            positions = delta[f"{name}{_SEP}idx"].astype(np.int64)
            if positions.size and (positions.min() < 0 or positions.max() >= flat.size):
                raise WeightsError(f"{name}: delta index out of range")
        elif f"{name}{_SEP}mask" in delta:
            mask = np.unpackbits(delta[f"{name}{_SEP}mask"], count=flat.size).astype(bool)
            positions = np.flatnonzero(mask)
        else:
            raise WeightsError(f"{name}: delta has neither indices nor a mask")
        if values.size != positions.size or values.dtype != flat.dtype:
            raise WeightsError(f"{name}: {values.size} {values.dtype} values for {positions.size} {flat.dtype} positions")
        flat[positions] = values
        out[name] = flat.reshape(old.shape)
    expected = {key.rsplit(_SEP, 1)[0] for key in delta}
    if expected != set(base):
        raise WeightsError(f"delta names {sorted(expected ^ set(base))} do not match the base")
    return out


def density(base: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray]) -> float:
    """Fraction of elements whose bits changed."""
    changed = sum(int(np.count_nonzero(_bits(base[k]) != _bits(v))) for k, v in new.items())
    total = sum(v.size for v in new.values())
    return changed / max(total, 1)


def nbytes(arrays: Mapping[str, np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in arrays.values())


def quantize(arrays: Mapping[str, np.ndarray], encoding: str) -> dict[str, np.ndarray]:
    """Lossy full weights: bfloat16, or int8 with a per-tensor symmetric scale."""
    out: dict[str, np.ndarray] = {}
    for name, a in arrays.items():
        if a.dtype.kind != "f" and a.dtype != ml_dtypes.bfloat16:
            out[name] = a  # integer tensors travel as they are
        elif encoding == BF16:
            out[name] = a.astype(ml_dtypes.bfloat16)
        elif encoding == INT8:
            x = a.astype(np.float32)
            scale = float(np.max(np.abs(x))) / 127.0 if x.size else 0.0
            q = np.zeros(x.shape, np.int8) if scale == 0 else np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
            out[f"{name}{_SEP}q8"] = q
            out[f"{name}{_SEP}scale"] = np.array(scale, np.float32)
        else:
            raise WeightsError(f"unknown quantisation {encoding!r}")
    return out


def dequantize(arrays: Mapping[str, np.ndarray], dtypes: Mapping[str, np.dtype]) -> dict[str, np.ndarray]:
    """Back to the receiver's parameter dtypes (``dtypes``: name -> dtype it holds)."""
    out: dict[str, np.ndarray] = {}
    for name, dtype in dtypes.items():
        if f"{name}{_SEP}q8" in arrays:
            scale = arrays[f"{name}{_SEP}scale"].astype(np.float32)
            out[name] = (arrays[f"{name}{_SEP}q8"].astype(np.float32) * scale).astype(dtype)
        elif name in arrays:
            out[name] = arrays[name].astype(dtype)
        else:
            raise WeightsError(f"{name}: missing from quantised weights")
    return out
