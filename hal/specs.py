"""Named array specs for observations and actions, and their validation.

A spec says what crosses the HAL boundary: the shape, dtype and (optionally)
bounds of one named array. Observations are a :class:`DictSpec` of named
arrays (images included); an action is one :class:`ArraySpec`. Validation
rejects wrong shapes, dtypes and non-finite values with a :class:`SpecError`
that names the field, so bad hardware data never reaches training. Specs
serialise to plain msgpack-able dicts for the wire handshake.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from .dtypes import dtype_from_name, dtype_name, is_float


class SpecError(ValueError):
    """A value does not match its spec; the message names the field."""


def _as_bound(value, shape: tuple[int, ...], dtype: np.dtype, what: str, name: str):
    if value is None:
        return None
    bound = np.asarray(value, dtype=np.float64)
    try:
        bound = np.broadcast_to(bound, shape).copy()
    except ValueError as err:
        raise SpecError(f"{name}: {what} of shape {bound.shape} does not fit shape {shape}") from err
    if np.isnan(bound).any():
        raise SpecError(f"{name}: {what} contains NaN")
    bound.setflags(write=False)
    return bound


@dataclass(frozen=True, eq=False)
class ArraySpec:
    """One named array: shape, dtype and optional inclusive bounds."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    minimum: np.ndarray | None = None
    maximum: np.ndarray | None = None
    names: tuple[str, ...] | None = None
    """One name per element of a vector (a robot's joints, ``shoulder_pan.pos``): what a teleoperator's
    or a dataset's features are matched to; None: the elements are known by position only."""

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise SpecError(f"{self.name}: negative dimension in shape {self.shape}")
        object.__setattr__(self, "dtype", np.dtype(dtype_from_name(dtype_name(self.dtype))))
        lo = _as_bound(self.minimum, self.shape, self.dtype, "minimum", self.name)
        hi = _as_bound(self.maximum, self.shape, self.dtype, "maximum", self.name)
        if lo is not None and hi is not None and (lo > hi).any():
            raise SpecError(f"{self.name}: minimum exceeds maximum")
        object.__setattr__(self, "minimum", lo)
        object.__setattr__(self, "maximum", hi)
        if self.names is not None:
            names = tuple(self.names)
            if len(self.shape) != 1 or len(names) != self.shape[0]:
                raise SpecError(f"{self.name}: {len(names)} element names for shape {self.shape} (names are "
                                "for vectors, one each)")
            if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
                raise SpecError(f"{self.name}: element names must be distinct non-empty strings, got {list(names)}")
            object.__setattr__(self, "names", names)
        object.__setattr__(self, "_float", is_float(self.dtype))  # cached: validate is per step

    @property
    def bounded(self) -> bool:
        return self.minimum is not None and self.maximum is not None

    @property
    def limits(self) -> tuple[np.ndarray, np.ndarray]:
        """(minimum, maximum), each -inf / +inf where the spec has no bound."""
        return (self.minimum if self.minimum is not None else np.full(self.shape, -np.inf),
                self.maximum if self.maximum is not None else np.full(self.shape, np.inf))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def validate(self, value, *, check_bounds: bool = False) -> np.ndarray:
        """Return ``value`` as an array of this spec, or raise :class:`SpecError`.

        Python scalars and lists are accepted when they convert exactly;
        an ndarray must already have the spec's dtype (no silent casts of
        hardware data). Bounds are checked only when asked: observations may
        legitimately leave their nominal range, actions must not.
        """
        return self._check(self._as_array(value), self.shape, check_bounds)

    def validate_batch(self, value, length: int, *, check_bounds: bool = False) -> np.ndarray:
        """Validate ``length`` stacked values: shape ``(length, *shape)``."""
        return self._check(self._as_array(value), (length, *self.shape), check_bounds)

    def _as_array(self, value) -> np.ndarray:
        if isinstance(value, np.ndarray):
            if value.dtype.newbyteorder("=") != self.dtype:
                raise SpecError(f"{self.name}: dtype {value.dtype} where {dtype_name(self.dtype)} was expected")
            return value
        if isinstance(value, (bool, int, float, list, tuple, np.generic)):
            array = np.asarray(value)
            if array.dtype.kind not in "biuf":
                raise SpecError(f"{self.name}: cannot read {type(value).__name__} as {dtype_name(self.dtype)}")
            return array.astype(self.dtype)
        raise SpecError(f"{self.name}: expected an array, got {type(value).__name__}")

    def _check(self, array: np.ndarray, shape: tuple[int, ...], check_bounds: bool) -> np.ndarray:
        if array.shape != shape:
            raise SpecError(f"{self.name}: shape {array.shape} where {shape} was expected")
        # A small array's finiteness is cheaper to test in Python (NaN and inf
        # propagate through the sum) than with a numpy reduction; a non-finite
        # sum (also a finite overflow) falls through to the exact test.
        if self._float and not (array.size <= 64 and math.isfinite(sum(array.ravel().tolist()))):
            finite = np.isfinite(array)
            if not finite.all():
                bad = int(np.flatnonzero(~finite.reshape(-1))[0])
                raise SpecError(f"{self.name}: non-finite value {array.reshape(-1)[bad]} at flat index {bad}")
        if check_bounds:
            values = array.astype(np.float64, copy=False)
            if self.minimum is not None and (values < self.minimum).any():
                raise SpecError(f"{self.name}: value below minimum {self.minimum.tolist()}")
            if self.maximum is not None and (values > self.maximum).any():
                raise SpecError(f"{self.name}: value above maximum {self.maximum.tolist()}")
        return array

    def zeros(self) -> np.ndarray:
        return np.zeros(self.shape, self.dtype)

    def clip(self, value: np.ndarray) -> np.ndarray:
        """``value`` clipped into the bounds (unbounded sides untouched)."""
        lo = -np.inf if self.minimum is None else self.minimum
        hi = np.inf if self.maximum is None else self.maximum
        return np.clip(value, lo, hi).astype(self.dtype)

    def sample_uniform(self, rng: np.random.Generator) -> np.ndarray:
        if not self.bounded:
            raise SpecError(f"{self.name}: cannot sample uniformly from an unbounded spec")
        if self.dtype.kind in "iu":  # both bounds included
            return rng.integers(self.minimum.astype(np.int64), self.maximum.astype(np.int64),
                                endpoint=True).astype(self.dtype)
        return rng.uniform(self.minimum, self.maximum).astype(self.dtype)

    def to_msg(self) -> dict:
        msg = {"name": self.name, "shape": list(self.shape), "dtype": dtype_name(self.dtype)}
        for key, bound in (("minimum", self.minimum), ("maximum", self.maximum)):
            if bound is not None:  # a uniform bound travels as one number (images: 0..255)
                flat = bound.reshape(-1)
                msg[key] = float(flat[0]) if flat.size and (flat == flat[0]).all() else flat.tolist()
        if self.names is not None:
            msg["names"] = list(self.names)
        return msg

    @classmethod
    def from_msg(cls, msg: Mapping) -> ArraySpec:
        if not isinstance(msg, Mapping):
            raise SpecError(f"spec must be a map, got {type(msg).__name__}")
        try:
            name, shape, dtype = msg["name"], msg["shape"], msg["dtype"]
        except KeyError as err:
            raise SpecError(f"spec lacks {err.args[0]!r}") from err
        if not isinstance(name, str) or not isinstance(shape, (list, tuple)):
            raise SpecError(f"malformed spec {msg!r}")
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise SpecError(f"{name}: shape must be integers, got {shape!r}")
        try:
            np_dtype = dtype_from_name(dtype)
        except ValueError as err:
            raise SpecError(f"{name}: {err}") from err

        def bound(key):
            if key not in msg:
                return None
            value = np.asarray(msg[key], dtype=np.float64)
            return value if value.ndim == 0 else value.reshape(tuple(shape))

        names = msg.get("names")
        if names is not None and not (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)):
            raise SpecError(f"{name}: element names must be a list of strings, got {names!r}")
        try:
            spec = cls(name, tuple(shape), np_dtype, bound("minimum"), bound("maximum"))
        except (TypeError, ValueError) as err:
            raise SpecError(f"{name}: malformed bounds: {err}") from err
        return spec if names is None else cls(name, spec.shape, np_dtype, spec.minimum, spec.maximum, tuple(names))

    def __eq__(self, other) -> bool:
        return isinstance(other, ArraySpec) and self.to_msg() == other.to_msg()

    def __hash__(self) -> int:
        return hash((self.name, self.shape, dtype_name(self.dtype)))

    def __repr__(self) -> str:
        bounds = f", [{self.minimum.min()}, {self.maximum.max()}]" if self.bounded else ""
        return f"ArraySpec({self.name!r}, {self.shape}, {dtype_name(self.dtype)}{bounds})"


def bounded(name: str, shape, dtype, minimum, maximum, names=None) -> ArraySpec:
    """An :class:`ArraySpec` with both bounds (actions, images)."""
    return ArraySpec(name, tuple(shape), np.dtype(dtype), minimum, maximum, names)


@dataclass(frozen=True, eq=False)
class DictSpec(Mapping):
    """A dict of named :class:`ArraySpec`, in a fixed (sorted) order."""

    specs: tuple[ArraySpec, ...] = field(default_factory=tuple)

    def __post_init__(self):
        specs = tuple(sorted(self.specs, key=lambda s: s.name))
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise SpecError(f"duplicate field names in {names}")
        object.__setattr__(self, "specs", specs)
        object.__setattr__(self, "_by_name", {s.name: s for s in specs})  # O(1) lookups per step

    @classmethod
    def of(cls, *specs: ArraySpec) -> DictSpec:
        return cls(tuple(specs))

    def __getitem__(self, name: str) -> ArraySpec:
        return self._by_name[name]

    def __contains__(self, name) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return (s.name for s in self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def validate(self, value, *, check_bounds: bool = False) -> dict[str, np.ndarray]:
        """Validate a dict of arrays; missing or unexpected fields are errors."""
        if not isinstance(value, Mapping):
            raise SpecError(f"expected a dict of arrays with fields {list(self)}, got {type(value).__name__}")
        if value.keys() != self._by_name.keys():
            missing = [name for name in self if name not in value]
            extra = [name for name in value if name not in self]
            raise SpecError(f"observation fields: missing {missing}, unexpected {extra}")
        return {s.name: s.validate(value[s.name], check_bounds=check_bounds) for s in self.specs}

    def zeros(self) -> dict[str, np.ndarray]:
        return {s.name: s.zeros() for s in self.specs}

    def to_msg(self) -> list[dict]:
        return [s.to_msg() for s in self.specs]

    @classmethod
    def from_msg(cls, msg) -> DictSpec:
        if not isinstance(msg, (list, tuple)):
            raise SpecError(f"observation spec must be a list, got {type(msg).__name__}")
        return cls(tuple(ArraySpec.from_msg(m) for m in msg))

    def __eq__(self, other) -> bool:
        return isinstance(other, DictSpec) and self.to_msg() == other.to_msg()

    def __hash__(self) -> int:
        return hash(tuple(self.specs))
