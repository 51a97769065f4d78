"""The dtypes that may cross the HAL boundary and the wire, by name.

Names are the contract: the wire carries a dtype *name*, never a numpy
``descr``, so a malformed header cannot ask for an object or structured dtype.
Arrays travel little-endian.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}

SUPPORTED_DTYPES: tuple[str, ...] = tuple(_DTYPES)
FLOAT_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16"})


def dtype_from_name(name: object) -> np.dtype:
    """The numpy dtype called ``name``; ``ValueError`` for anything unsupported."""
    if not isinstance(name, str) or name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    return _DTYPES[name]


def dtype_name(dtype: object) -> str:
    """The wire name of ``dtype`` (a numpy dtype, type or name)."""
    if isinstance(dtype, str):
        dtype_from_name(dtype)
        return dtype
    try:
        resolved = np.dtype(dtype).newbyteorder("=")
    except TypeError as err:
        raise ValueError(f"unsupported dtype {dtype!r}") from err
    if resolved not in _NAMES:
        raise ValueError(f"unsupported dtype {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    return _NAMES[resolved]


def is_float(dtype: np.dtype) -> bool:
    return dtype_name(dtype) in FLOAT_DTYPES
