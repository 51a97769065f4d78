"""Which bytes carry a weight update to one actor: full, a sparse delta, or quantised.

The learner keeps its last few published versions. For an actor that holds
one of them (same incarnation), a lossless delta against it is computed once
per base and reused for every actor on that base; it is sent when it is
smaller than ``delta_max_fraction`` of the full weights. In ``auto`` mode the
delta is not even computed when the actor's measured downlink would move the
full weights faster than the delta can be computed, or when recent deltas
were dense (an fp32 policy trained with Adam changes nearly every element).
Lossy ``bf16``/``int8`` full weights are sent only when pinned by the
setting. Every update carries the checksum of the full weights it stands for.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..hal.dtypes import dtype_name
from ..hal.steps import PolicyVersion
from ..hal.wire import protocol as P
from ..hal.wire import weights as W
from ..hal.wire.codec import encode

MODES = ("auto", W.FULL, W.DELTA, W.BF16, W.INT8)


@dataclass(frozen=True)
class WeightsConfig:
    encoding: str = "auto"
    """auto (full or delta by measured bandwidth and density), or pinned: full, delta, bf16, int8."""
    history: int = 8
    """Published versions kept as possible delta bases."""
    delta_max_fraction: float = 0.5
    """Send a delta only when it is smaller than this fraction of the full weights."""

    def __post_init__(self):
        if self.encoding not in MODES:
            raise ValueError(f"weights.encoding must be one of {MODES}, got {self.encoding!r}")


@dataclass(frozen=True)
class Update:
    frames: list
    encoding: str
    nbytes: int


class WeightPublisher:
    def __init__(self, config: WeightsConfig = WeightsConfig()):
        self.config = config
        self.version: PolicyVersion | None = None
        self._arrays: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()  # count -> arrays
        self._checksum = ""
        self._cache: dict[tuple, Update] = {}
        self._density = 0.0  # EWMA of recent delta densities
        self._delta_s_per_byte = 0.0  # EWMA of delta computation cost
        self.sent: dict[str, int] = {}

    def publish(self, version: PolicyVersion, arrays: dict[str, np.ndarray], checksum: str | None = None) -> None:
        """Make ``arrays`` the current weights; ``checksum``: theirs, where already verified (a relay's,
        from the learner's update), else computed here."""
        if self.version is not None and version.incarnation != self.version.incarnation:
            self._arrays.clear()
        self.version = version
        self._arrays[version.count] = {k: np.array(v, copy=True) for k, v in arrays.items()}
        while len(self._arrays) > self.config.history:
            self._arrays.popitem(last=False)
        self._checksum = checksum or W.checksum(self._arrays[version.count])
        self._cache.clear()

    @property
    def current(self) -> dict[str, np.ndarray]:
        return self._arrays[self.version.count]

    def update_for(self, held: PolicyVersion | None, downlink_bps: float | None,
                   accepts: frozenset[str] | None = None) -> Update:
        """The update to send to an actor holding ``held`` over a link of ``downlink_bps`` that
        decodes the encodings ``accepts`` (None: all; full weights go to one that decodes nothing else)."""
        mode = self.config.encoding
        if accepts is not None and (W.DELTA if mode == "auto" else mode) not in accepts:
            mode = W.FULL  # auto may send a delta; a pinned mode sends itself
        if mode in (W.BF16, W.INT8):
            update = self._cached((mode,), lambda: self._lossy(mode))
        else:
            update = self._full()
            base = self._base_for(held)
            if base is not None and mode != W.FULL and (mode == W.DELTA or self._delta_pays(update, downlink_bps)):
                delta = self._cached((W.DELTA, held.count), lambda: self._delta(held.count))
                if mode == W.DELTA or delta.nbytes < self.config.delta_max_fraction * update.nbytes:
                    update = delta
        self.sent[update.encoding] = self.sent.get(update.encoding, 0) + 1
        return update

    # -- encodings -------------------------------------------------------
    def _fields(self, encoding: str, **extra) -> dict:
        return {"version": list(self.version), "encoding": encoding, "checksum": self._checksum, **extra}

    def _full(self) -> Update:
        return self._cached((W.FULL,), lambda: self._update(W.FULL, self._fields(W.FULL), self.current))

    def _lossy(self, mode: str) -> Update:
        dtypes = {k: dtype_name(v.dtype) for k, v in self.current.items()}
        return self._update(mode, self._fields(mode, dtypes=dtypes), W.quantize(self.current, mode))

    def _delta(self, base_count: int) -> Update:
        start = time.perf_counter()
        base = self._arrays[base_count]
        delta = W.encode_delta(base, self.current)
        full_bytes = W.nbytes(self.current)
        cost = (time.perf_counter() - start) / max(full_bytes, 1)
        self._delta_s_per_byte = cost if not self._delta_s_per_byte else 0.8 * self._delta_s_per_byte + 0.2 * cost
        density = W.density(base, self.current)
        self._density = 0.8 * self._density + 0.2 * density
        base_version = [self.version.incarnation, base_count]
        return self._update(W.DELTA, self._fields(W.DELTA, base=base_version), delta)

    @staticmethod
    def _update(encoding: str, fields: dict, arrays: dict) -> Update:
        return Update(encode(P.WEIGHTS, fields, arrays), encoding, W.nbytes(arrays))

    def _cached(self, key: tuple, make) -> Update:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def _base_for(self, held: PolicyVersion | None) -> int | None:
        if held is None or self.version is None or held.incarnation != self.version.incarnation:
            return None
        if held.count == self.version.count or held.count not in self._arrays:
            return None
        return held.count

    def _delta_pays(self, full: Update, downlink_bps: float | None) -> bool:
        if self._density > 0.5 and self.version.count % 20:
            return False  # recent deltas were dense; look again every 20 publications
        if downlink_bps and self._delta_s_per_byte:
            return full.nbytes / downlink_bps > self._delta_s_per_byte * full.nbytes
        return True
