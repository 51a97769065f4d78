"""Optional compression of large frames (zstd or lz4), used only when it pays.

Whether it pays depends on the data (images of a static scene compress,
float noise does not) and on the link (on loopback nothing beats sending raw
bytes). :class:`AdaptiveCompression` decides from measurements: every
``trial_every`` batches it times zstd and lz4 on a real batch, and picks the
codec that minimises compress time plus transfer time at the measured
uplink bandwidth, or none. Decompression is always bounded by the size the
header declares, so a hostile frame cannot inflate past it.
"""

from __future__ import annotations

import time

CODECS = ("zstd", "lz4")
MIN_FRAME_BYTES = 4096


class CompressionUnavailable(RuntimeError):
    pass


def _zstd():
    try:
        import zstandard
    except ImportError as err:
        raise CompressionUnavailable("zstd needs the 'zstandard' package (extra: compress)") from err
    return zstandard


def _lz4():
    try:
        import lz4.block
    except ImportError as err:
        raise CompressionUnavailable("lz4 needs the 'lz4' package (extra: compress)") from err
    return lz4.block


def compress(data, codec: str) -> bytes:
    if codec == "zstd":
        return _zstd().ZstdCompressor(level=1).compress(data)
    if codec == "lz4":
        return _lz4().compress(data, store_size=False)
    raise ValueError(f"unknown compression {codec!r}")


def decompress(data, codec: str, nbytes: int) -> bytes:
    """Inflate to exactly ``nbytes`` or raise ValueError; never more."""
    if codec == "zstd":
        out = _zstd().ZstdDecompressor().decompress(data, max_output_size=nbytes)
    elif codec == "lz4":
        out = _lz4().decompress(data, uncompressed_size=nbytes)
    else:
        raise ValueError(f"unknown compression {codec!r}")
    if len(out) != nbytes:
        raise ValueError(f"inflated to {len(out)} bytes, header declares {nbytes}")
    return out


class AdaptiveCompression:
    """Chooses a codec (or none) for a link from measured ratio, speed and bandwidth."""

    def __init__(self, mode: str = "auto", trial_every: int = 100):
        if mode not in ("auto", "off", *CODECS):
            raise ValueError(f"compression must be auto, off, zstd or lz4; got {mode!r}")
        self.mode = mode
        self.trial_every = trial_every
        self.codec: str | None = mode if mode in CODECS else None
        self._batches = 0
        self.uplink_bps: float | None = None
        self.last_trial: dict[str, dict[str, float]] = {}

    def note_bandwidth(self, bps: float) -> None:
        self.uplink_bps = bps if self.uplink_bps is None else 0.8 * self.uplink_bps + 0.2 * bps

    def choose(self, arrays) -> str | None:
        """The codec for a batch whose large arrays are among ``arrays``."""
        if self.mode != "auto":
            return self.codec
        self._batches += 1
        if (self._batches - 1) % self.trial_every == 0 and self.uplink_bps:
            self._trial(arrays)
        return self.codec

    def _trial(self, arrays) -> None:
        sample = b"".join(a.tobytes() for a in arrays if a.nbytes >= MIN_FRAME_BYTES)
        if not sample:
            self.codec = None
            return
        best, best_s = None, len(sample) / self.uplink_bps
        self.last_trial = {}
        for codec in CODECS:
            try:
                start = time.perf_counter()
                size = len(compress(sample, codec))
                seconds = time.perf_counter() - start + size / self.uplink_bps
            except CompressionUnavailable:
                continue
            self.last_trial[codec] = {"ratio": size / len(sample), "seconds": seconds}
            if seconds < 0.9 * best_s:
                best, best_s = codec, seconds
        self.codec = best
