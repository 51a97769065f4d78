"""Messages as a small msgpack header plus raw little-endian array frames.

A message is a ZeroMQ multipart ``[header, frame_0, ..., frame_n]``. The
header is a msgpack map ``{"p": protocol, "k": kind, "f": fields, "a":
[[name, dtype, shape(, codec)], ...]}`` describing each following frame.
Small arrays (under 64 KiB, ZeroMQ's zero-copy threshold) travel together:
their descriptors carry the codec ``"packed"`` and their bytes lie end to
end, each at an 8-byte aligned offset of one last frame (the frame itself
may start at any address: over TCP, ZeroMQ's buffer can be misaligned, which
numpy handles, a little slower). A step batch of
16 columns is then 2 frames, not 17, which is most of a small batch's cost
on both sides (a frame is a ZeroMQ message part and a Python object). Nothing is
ever unpickled: dtypes travel by name (see :mod:`..dtypes`), and
:func:`decode` checks every size, count and shape against :class:`Limits`
before it builds an array, so a malformed or hostile message costs one
:class:`MessageError` and nothing else. Decoded arrays are read-only views
of the received frames (no copy).

Versions: the header's ``p`` is the protocol the sender wrote. Packing came
with protocol 2; :func:`decode` reads 1 and 2 (older actors, spools written
before), and the handshake refuses a peer of another version by name (see
:mod:`.protocol`), so a version mismatch is never a stream of silently
rejected batches.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import msgpack
import numpy as np

from ..dtypes import SUPPORTED_DTYPES, dtype_from_name, dtype_name
from .compression import CODECS, MIN_FRAME_BYTES, CompressionUnavailable, compress, decompress

PROTOCOL_VERSION = 2
"""2: small arrays may share one packed frame. 1: one frame per array (older peers, old spools)."""
PROTOCOLS = (1, 2)
"""The versions :func:`decode` reads; :func:`encode` writes either (1 never packs)."""
PACKED_SINCE = 2
PACKED = "packed"
"""The codec of arrays that share the message's last frame."""
PACK_BELOW_BYTES = 64 * 1024
"""Arrays smaller than this are packed (pyzmq copies frames this small anyway)."""
_ALIGN = 8


class MessageError(ValueError):
    """A message was refused; ``reason`` is a short tag for counting."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Limits:
    """Upper bounds a receiver enforces before it allocates anything."""

    max_header_bytes: int = 64 * 1024
    max_arrays: int = 512
    max_ndim: int = 8
    max_name_chars: int = 256
    max_frame_bytes: int = 1 << 30
    max_message_bytes: int = 1 << 30

    def within(self, arrays: int, nbytes: int) -> Limits:
        """These limits tightened to ``arrays`` arrays of ``nbytes`` in all (a receiver that knows
        what a valid message holds), never looser than they are."""
        most = min(self.max_message_bytes, nbytes)
        return Limits(self.max_header_bytes, min(self.max_arrays, arrays), self.max_ndim, self.max_name_chars,
                      min(self.max_frame_bytes, most), most)


DEFAULT_LIMITS = Limits()
# wire name -> little-endian numpy dtype
_WIRE_DTYPES = {name: dtype_from_name(name).newbyteorder("<") for name in SUPPORTED_DTYPES}


@dataclass(frozen=True)
class Message:
    kind: str
    fields: dict = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    protocol: int = PROTOCOL_VERSION
    """The version the sender wrote it in (its header's ``p``)."""


_NAME_AND_WIRE: dict[np.dtype, tuple[str, np.dtype]] = {}  # dtype -> (wire name, little-endian dtype)


def _wire_array(array: np.ndarray) -> tuple[list, np.ndarray]:
    array = np.asarray(array)
    known = _NAME_AND_WIRE.get(array.dtype)
    if known is None:  # once per dtype: dtype_name raises for unsupported ones
        known = _NAME_AND_WIRE[array.dtype] = (dtype_name(array.dtype), array.dtype.newbyteorder("<"))
    name, little = known
    if array.dtype != little or not array.flags.c_contiguous:
        array = np.ascontiguousarray(array, dtype=little)
    return [name, list(array.shape)], array.reshape(-1).view(np.uint8)


def encode(kind: str, fields: dict | None = None,
           arrays: dict[str, np.ndarray] | None = None, compression: str | None = None,
           protocol: int = PROTOCOL_VERSION) -> list:
    """Frames for ``socket.send_multipart(frames, copy=False)``.

    Large frames go out without a copy; arrays below ``PACK_BELOW_BYTES``
    (pyzmq's ``copy_threshold``, where zero-copy costs more than it saves)
    are copied into one shared last frame when there are two or more.
    With ``compression`` ("zstd" or "lz4"), frames of at least 4 KiB that
    shrink are sent compressed; their descriptor names the codec.
    ``protocol`` 1 writes what a protocol-1 peer reads: one frame per array.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r}: this side writes {PROTOCOLS}")
    items = []  # (descriptor, bytes), in the caller's order: a decoded dict keeps it
    for name, array in (arrays or {}).items():
        (dtype, shape), flat = _wire_array(array)
        if compression and flat.nbytes >= MIN_FRAME_BYTES:
            packed = compress(flat, compression)
            if len(packed) < 0.9 * flat.nbytes:
                items.append(([name, dtype, shape, compression], packed))
                continue
        items.append(([name, dtype, shape], flat))
    small = [i for i, (d, flat) in enumerate(items) if len(d) == 3 and flat.nbytes < PACK_BELOW_BYTES]
    if len(small) < 2 or protocol < PACKED_SINCE:  # nothing to share a frame with: one frame each
        small = []
    for i in small:
        items[i][0].append(PACKED)
    frames = [flat for d, flat in items if len(d) == 3 or d[3] != PACKED]
    if small:
        frames.append(_pack([items[i][1] for i in small]))
    header = {"p": protocol, "k": kind, "f": fields or {}, "a": [d for d, _ in items]}
    return [msgpack.packb(header, use_bin_type=True), *frames]


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _pack(flats: list[np.ndarray]) -> bytearray:
    """Byte arrays end to end, each at an aligned offset (zero padding between)."""
    offsets, end = [], 0
    for flat in flats:
        start = _aligned(end)
        offsets.append(start)
        end = start + flat.nbytes
    out = bytearray(end)
    view = memoryview(out)
    for start, flat in zip(offsets, flats, strict=True):
        view[start:start + flat.nbytes] = flat
    return out


def _buffer(frame) -> memoryview:
    buf = getattr(frame, "buffer", None)  # zmq.Frame
    return buf if buf is not None else memoryview(frame)


@dataclass(frozen=True)
class Header:
    """A message's parsed header: what it is and what its frames declare, nothing decoded yet.

    A receiver reads this first and decides (a known peer? sizes within its
    limits?) before :func:`decode_arrays` touches a byte of the arrays or
    inflates a compressed frame."""

    kind: str
    fields: dict
    protocol: int
    arrays: tuple
    """(name, dtype, shape, codec) per array, checked against the limits."""
    declared_bytes: int
    """What the arrays take once decoded: checked against ``max_message_bytes``."""


class HeaderMemo:
    """A receiver's memory of one peer's last array descriptors and what checking them gave: a peer
    that sends batches of one shape again (nearly every batch) is checked by one comparison of the
    descriptors. Keep one per peer, with that peer's limits (the check depends on them)."""

    __slots__ = ("protocol", "descriptors", "checked", "total", "packed")

    def __init__(self):
        self.protocol = -1
        self.descriptors: list | None = None
        self.checked: tuple = ()
        self.total = self.packed = 0


def parse_header(frames: list, limits: Limits = DEFAULT_LIMITS, memo: HeaderMemo | None = None) -> Header:
    """Parse and check the header of one multipart message; raise :class:`MessageError`.

    Every declared size is checked here, before anything is decompressed:
    each array against ``max_frame_bytes``, their sum against
    ``max_message_bytes``, and each frame's length against what it declares
    (a compressed frame is never larger than its arrays)."""
    if not frames:
        raise MessageError("empty", "message has no frames")
    header_buf = _buffer(frames[0])
    if header_buf.nbytes > limits.max_header_bytes:
        raise MessageError("header_size", f"header of {header_buf.nbytes} bytes exceeds {limits.max_header_bytes}")
    try:
        # unpackb bounds every container by the (already checked) buffer size
        header = msgpack.unpackb(header_buf, raw=False, strict_map_key=True)
    except Exception as err:  # msgpack raises several unrelated types
        raise MessageError("header_malformed", f"header is not valid msgpack ({type(err).__name__})") from None
    if not isinstance(header, dict) or set(header) != {"p", "k", "f", "a"}:
        raise MessageError("header_malformed", "header must be a map with keys p, k, f, a")
    protocol = header["p"]
    if type(protocol) is not int or protocol not in PROTOCOLS:
        raise MessageError("protocol", f"protocol {protocol!r}; this side reads {list(PROTOCOLS)}")
    kind, fields, descriptors = header["k"], header["f"], header["a"]
    if not isinstance(kind, str) or not isinstance(fields, dict) or not isinstance(descriptors, list):
        raise MessageError("header_malformed", "kind must be a string, fields a map, arrays a list")
    if memo is not None and protocol == memo.protocol and descriptors == memo.descriptors:
        checked, total, packed = memo.checked, memo.total, memo.packed
    else:
        checked, total, packed = _check_descriptors(descriptors, protocol, limits)
        if memo is not None:
            memo.protocol, memo.descriptors = protocol, descriptors
            memo.checked, memo.total, memo.packed = checked, total, packed
    expected_frames = len(checked) - packed + (packed > 0)
    if expected_frames != len(frames) - 1:
        raise MessageError("frame_count", f"header describes {expected_frames} frames "
                           f"({len(descriptors)} arrays, {packed} packed), message has {len(frames) - 1}")
    return Header(kind, fields, protocol, checked, total)


def _check_descriptors(descriptors: list, protocol: int, limits: Limits) -> tuple[tuple, int, int]:
    """Each array's (name, dtype, shape, codec), checked against ``limits``; their bytes in all; how
    many share the packed frame."""
    if len(descriptors) > limits.max_arrays:
        raise MessageError("too_many_arrays", f"{len(descriptors)} arrays exceed {limits.max_arrays}")
    checked = tuple(_check_descriptor(d, limits) for d in descriptors)
    packed = sum(1 for c in checked if c[3] == PACKED)
    if packed and protocol < PACKED_SINCE:
        raise MessageError("protocol", f"packed arrays in a protocol {protocol} message (packing is {PACKED_SINCE})")
    total = 0
    for name, dtype, shape, _ in checked:
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > limits.max_frame_bytes:
            raise MessageError("frame_size", f"{name}: {nbytes} bytes exceed {limits.max_frame_bytes}")
        total += nbytes
    if total > limits.max_message_bytes:
        raise MessageError("message_size", f"arrays declare {total} bytes, more than {limits.max_message_bytes}")
    return checked, total, packed


def decode_arrays(header: Header, frames: list) -> Message:
    """The arrays of a message whose :class:`Header` was accepted, as read-only views
    (compressed frames inflate to at most their declared size)."""
    packed = any(c[3] == PACKED for c in header.arrays)
    shared = _buffer(frames[-1]) if packed else None
    shared_end = 0
    own = iter(frames[1:])
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape, codec in header.arrays:
        if name in arrays:
            raise MessageError("array_malformed", f"array {name!r} appears twice")
        nbytes = math.prod(shape) * dtype.itemsize
        if codec == PACKED:
            start = _aligned(shared_end)
            shared_end = start + nbytes
            if shared_end > shared.nbytes:
                raise MessageError("frame_size", f"{name}: packed frame of {shared.nbytes} bytes ends "
                                   f"before its {nbytes} bytes at offset {start}")
            arrays[name] = _view(shared, dtype, shape, name, start)
            continue
        buf = _buffer(next(own))
        if codec is not None:
            if buf.nbytes > nbytes:  # the sender compresses only what shrinks
                raise MessageError("compression", f"{name}: {codec} frame of {buf.nbytes} bytes for {nbytes}")
            try:
                buf = memoryview(decompress(buf, codec, nbytes))
            except (ValueError, CompressionUnavailable) as err:
                raise MessageError("compression", f"{name}: {err}") from None
            except Exception as err:  # the codecs' own error types
                raise MessageError("compression", f"{name}: corrupt {codec} frame ({type(err).__name__})") from None
        if buf.nbytes != nbytes:
            raise MessageError("frame_size", f"{name}: frame has {buf.nbytes} bytes, {dtype_name(dtype)}{list(shape)} needs {nbytes}")
        arrays[name] = _view(buf, dtype, shape, name)
    if shared is not None and shared_end != shared.nbytes:
        raise MessageError("frame_size", f"packed frame has {shared.nbytes} bytes, its arrays need {shared_end}")
    return Message(header.kind, header.fields, arrays, header.protocol)


@functools.lru_cache(maxsize=256)
def _packed_layout(descriptors: tuple) -> tuple[tuple, int] | None:
    """Each packed array's (offset, row-major strides) in the frame, and the frame's size; None where
    an array is not packed. Worked out once per descriptors (a peer sends batches of one shape)."""
    layout, end = [], 0
    for _, dtype, shape, codec in descriptors:
        if codec != PACKED:
            return None
        strides, step = [], dtype.itemsize
        for dim in reversed(shape):
            strides.append(step)
            step *= dim
        layout.append((_aligned(end), tuple(reversed(strides))))
        end = layout[-1][0] + math.prod(shape) * dtype.itemsize
    return tuple(layout), end


def decode_joined(header: Header, bodies: list[list]) -> dict[str, np.ndarray] | None:
    """The arrays of several messages that share ``header``'s descriptors, every array packed, joined
    row-wise in message order: one copy of the frames, then one strided copy per array (not a view
    per array per message). None where an array is not packed or a message's packed frame is not the
    size its header declares: decode each then, to refuse the one at fault by name. Each message's
    header was accepted by :func:`parse_header` (so its frame count fits: one packed frame)."""
    packed = _packed_layout(header.arrays)
    if packed is None:
        return None
    layout, end = packed
    frames = [_buffer(body[-1]) for body in bodies]
    if any(frame.nbytes != end for frame in frames):
        return None
    joined, n = b"".join(frames), len(frames)
    arrays = {}
    for (name, dtype, shape, _), (start, strides) in zip(header.arrays, layout, strict=True):
        each = np.ndarray((n, *shape), dtype, buffer=joined, offset=start, strides=(end, *strides))
        arrays[name] = each.reshape(n * shape[0], *shape[1:])
    return arrays


def decode(frames: list, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Parse and validate one multipart message; raise :class:`MessageError`."""
    return decode_arrays(parse_header(frames, limits), frames)


def _view(buf, dtype: np.dtype, shape: tuple, name: str, offset: int = 0) -> np.ndarray:
    """The frame's bytes from ``offset`` as an array of ``shape``, read-only (sizes were checked;
    numpy's own refusals, if any remain, become a MessageError too)."""
    try:
        array = np.ndarray(shape, dtype, buffer=buf, offset=offset)
    except (ValueError, TypeError) as err:
        raise MessageError("array_malformed", f"{name}: shape {list(shape)} refused ({err})") from None
    if array.flags.writeable:  # a received frame never changes: the replay's write-behind relies on it
        array.flags.writeable = False
    return array


def _check_descriptor(descriptor, limits: Limits):
    if type(descriptor) is not list or not 3 <= len(descriptor) <= 4:
        raise MessageError("array_malformed", f"array descriptor {descriptor!r} is not [name, dtype, shape(, codec)]")
    name, dtype, shape = descriptor[0], descriptor[1], descriptor[2]
    codec = descriptor[3] if len(descriptor) == 4 else None
    if codec is not None and codec not in CODECS and codec != PACKED:
        raise MessageError("compression", f"{name!r}: unknown compression {codec!r}")
    if type(name) is not str or not 0 < len(name) <= limits.max_name_chars:
        raise MessageError("array_malformed", f"array name {name!r} is not a short string")
    np_dtype = _WIRE_DTYPES.get(dtype) if type(dtype) is str else None
    if np_dtype is None:
        raise MessageError("dtype", f"{name}: unsupported dtype {dtype!r}")
    if type(shape) is not list or len(shape) > limits.max_ndim:
        raise MessageError("array_malformed", f"{name}: shape {shape!r} is not a list of at most {limits.max_ndim} dims")
    for d in shape:  # msgpack ints are 64-bit at most
        if type(d) is not int or d < 0:
            raise MessageError("array_malformed", f"{name}: shape {shape!r} has a bad dimension")
    # an empty array's other dims still must fit memory: numpy refuses shapes whose non-zero
    # dims overflow its index type, e.g. [0, 2**63], after any size check that counts bytes
    if 0 in shape and math.prod(d for d in shape if d) * np_dtype.itemsize > limits.max_frame_bytes:
        raise MessageError("array_malformed", f"{name}: empty shape {shape!r} has dimensions beyond "
                           f"{limits.max_frame_bytes} bytes")
    return name, np_dtype, tuple(shape), codec
