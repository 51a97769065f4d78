"""A peer's line to the operator console (``embodyrl console``).

:class:`ConsoleLink` is a thread that owns one DEALER socket to the
console's control endpoint (:mod:`.wire.control`). The loop it serves (an
actor's, a learner's) never waits on it: it hands over its latest status and
observations by reference (:meth:`~ConsoleLink.publish_status`,
:meth:`~ConsoleLink.offer`) and takes the console's commands at its own
pace (:meth:`~ConsoleLink.take_commands`), answering each with
:meth:`~ConsoleLink.done`. Commands are applied by the loop's own thread
because a device's driver is not thread-safe (a robot server's client owns
one socket); an actor takes them every control period and in every wait, so
an e-stop reaches the driver within a period of arriving.

The console binds the peer's role and id to this link's connection (or,
with keys, to its key). The thread sends STATUS every
:data:`~.wire.control.STATUS_EVERY_S`, whether or not the loop has
published anything new, so the console knows its holder is alive; refused
because the id's holder was heard lately (a predecessor that has just died),
it says HELLO again as soon as the console says the claim may pass, and
keeps trying for as long as the link runs.

Camera frames are encoded here, not in the loop: at the rate the operator
picked, the thread JPEG-encodes the newest image of each camera (shrunk to
the width picked) and sends it if the socket takes it at once. A frame that
is not sent is dropped, never queued; an image that arrives before the last
was encoded replaces it.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import queue
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import zmq

from .specs import DictSpec
from .wire import control
from .wire.codec import MessageError, decode, encode
from .wire.control import Command, StreamSettings
from .wire.security import ClientKeys, check_endpoint, secure_client

HELLO_EVERY_S = 2.0
"""A peer says HELLO this often: a restarted console knows it again within that."""


def camera_fields(spec: DictSpec) -> list[str]:
    """The image fields of an observation spec (uint8, height x width x channels)."""
    return [s.name for s in spec.specs
            if np.dtype(s.dtype) == np.uint8 and len(s.shape) == 3 and s.shape[-1] in (1, 3, 4)]


def encode_jpeg(image: np.ndarray, width: int, quality: int = 80) -> tuple[bytes, int, int]:
    """(JPEG bytes, width, height) of an HxWxC uint8 image shrunk to at most ``width`` pixels
    wide (every n-th pixel: cheap, and enough to watch a robot)."""
    from PIL import Image  # the console extra; only a peer that streams needs it

    step = max(1, -(-image.shape[1] // width))
    small = np.ascontiguousarray(image[::step, ::step])
    if small.shape[-1] == 1:
        small = small[..., 0]
    elif small.shape[-1] == 4:
        small = small[..., :3]
    buffer = io.BytesIO()
    Image.fromarray(small).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue(), small.shape[1], small.shape[0]


class ConsoleLink:
    """Status, frames and commands between one peer and the console; see the module docstring.

    Nothing is sent before :meth:`start`, which names the peer's devices (one map per device,
    ``{"device_id", "name", "cameras", "teleop"}``; a learner has none).
    """

    def __init__(self, endpoint: str, *, role: str, actor_id: int = 0,
                 keys: ClientKeys | None = None, allow_insecure: bool = False,
                 status_every_s: float = control.STATUS_EVERY_S, stream: StreamSettings | None = None):
        if role not in control.ROLES:
            raise ValueError(f"role must be one of {control.ROLES}, not {role!r}")
        check_endpoint(endpoint, keys is not None, allow_insecure)
        self.endpoint, self.role, self.actor_id = endpoint, role, actor_id
        self.devices: list[dict] = []
        self.keys = keys
        self.status_every_s = status_every_s
        self.stream = stream or StreamSettings()
        self.refused = ""
        """The console's reason, if it refused this peer (a version mismatch, a bad HELLO, an id
        held by another peer)."""
        self._hello_due = 0.0
        self.frames_sent = self.frames_dropped = 0
        self.stream_error = ""
        self._status: dict = {}
        self._images: dict[tuple[int, str], np.ndarray] = {}
        self._cameras: dict[int, tuple[str, ...]] = {}
        self._seq = itertools.count(1)
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[list] = queue.SimpleQueue()
        self._last_heard = 0.0
        self._stop = threading.Event()
        self._context = zmq.Context()
        self._thread = threading.Thread(target=self._run, name=f"console-{role}-{actor_id}", daemon=True)

    def start(self, devices: list[dict] = ()) -> ConsoleLink:
        """Dial the console and go on in the background; ``devices`` as the class says."""
        self.devices = [dict(d) for d in devices]
        self._cameras = {d["device_id"]: tuple(d.get("cameras", ())) for d in self.devices}
        self._thread.start()
        return self

    # -- the loop's side: never blocks ---------------------------------------
    @property
    def connected(self) -> bool:
        """Whether the console answered within the last few seconds."""
        return time.monotonic() - self._last_heard < 2 * HELLO_EVERY_S + 1

    def publish_status(self, status: dict) -> None:
        """The newest status; the thread sends it at its next turn."""
        self._status = status

    def offer(self, device_id: int, observation: Mapping[str, np.ndarray]) -> None:
        """The newest observation of a device: its camera images replace the ones not yet sent."""
        for name in self._cameras.get(device_id, ()):
            image = observation.get(name)
            if image is not None:
                self._images[(device_id, name)] = image

    def take_commands(self) -> list[Command]:
        """The commands that arrived since the last call, oldest first."""
        taken = []
        with contextlib.suppress(queue.Empty):
            while True:
                taken.append(self._commands.get_nowait())
        return taken

    def done(self, command: Command, ok: bool, error: str = "") -> None:
        """Answer a command (the console shows a failure with ``error``)."""
        self._outbox.put(encode(control.DONE, {"id": command.id, "ok": bool(ok), "error": str(error)[:500],
                                               "at": time.monotonic()}))

    def send_metrics(self, record: dict) -> None:
        """Forward one metrics record (the learner's curves and losses)."""
        self._outbox.put(encode(control.METRICS, {"record": record}))

    def close(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=5)
        self._context.term()

    def __enter__(self) -> ConsoleLink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the thread ------------------------------------------------------------
    def _socket(self) -> zmq.Socket:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 16)
        sock.setsockopt(zmq.RCVHWM, 64)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # nothing queued without a connection: a frame is dropped
        sock.setsockopt(zmq.MAXMSGSIZE, control.LIMITS.max_message_bytes + control.LIMITS.max_header_bytes)
        sock.setsockopt(zmq.RECONNECT_IVL, 200)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        if self.keys is not None:
            secure_client(sock, self.keys)
        sock.connect(self.endpoint)
        return sock

    def _run(self) -> None:
        sock = self._socket()
        try:
            now = time.monotonic()
            due = {"status": now, "frames": now}
            self._hello_due = now
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= self._hello_due:
                    self._send(sock, encode(control.HELLO, {
                        "protocol": control.CONTROL_PROTOCOL, "role": self.role, "actor_id": self.actor_id,
                        "devices": self.devices}))
                    self._hello_due = now + HELLO_EVERY_S
                with contextlib.suppress(queue.Empty):
                    while True:
                        self._send(sock, self._outbox.get_nowait())
                if now >= due["status"]:  # also before the loop's first status: the console hears it
                    self._send(sock, encode(control.STATUS, {"status": self._status}))
                    due["status"] = now + self.status_every_s
                if self.stream.fps > 0 and now >= due["frames"]:
                    self._send_frames(sock)
                    due["frames"] = now + 1.0 / self.stream.fps
                if sock.poll(10, zmq.POLLIN):
                    self._receive(sock)
        finally:
            sock.close(linger=0)

    def _send(self, sock: zmq.Socket, frames: list) -> bool:
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:  # no connection, or the console is behind: this message is dropped
            return False

    def _send_frames(self, sock: zmq.Socket) -> None:
        images, self._images = self._images, {}
        for (device_id, name), image in images.items():
            try:
                jpeg, width, height = encode_jpeg(image, self.stream.width)
            except ImportError:
                self.stream_error = "camera frames need Pillow: pip install 'embodyrl[console]'"
                return
            message = encode(control.FRAME, {"device": device_id, "field": name, "seq": next(self._seq),
                                             "width": width, "height": height},
                             {"jpeg": np.frombuffer(jpeg, np.uint8)})
            if self._send(sock, message):
                self.frames_sent += 1
            else:
                self.frames_dropped += 1

    def _receive(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            try:
                message = decode(frames, control.LIMITS)
            except MessageError as err:
                warnings.warn(f"console: a malformed message ignored ({err})", stacklevel=2)
                continue
            fields = message.fields
            if message.kind == control.WELCOME:
                with contextlib.suppress(MessageError):
                    self.stream = control.stream_settings(fields.get("stream"))
                self.refused = ""
            elif message.kind == control.REFUSED:
                self.refused = str(fields.get("reason", "refused"))[:500]
                after = fields.get("retry_after_s")
                if fields.get("retry") and isinstance(after, (int, float)):  # the holder may be gone by then
                    self._hello_due = min(self._hello_due, time.monotonic() + min(max(after, 0.05), HELLO_EVERY_S))
            elif message.kind == control.COMMAND:
                self._command(fields)

    def _command(self, fields: dict) -> None:
        try:
            command = control.command(fields)
        except MessageError as err:
            ident = fields.get("id")
            if isinstance(ident, str):
                self.done(Command(ident, "?"), False, str(err))
            return
        if command.action == "stream":  # the link's own: the rate and size of what it sends
            self.stream = control.stream_settings(command.value)
            self.done(command, True)
        else:
            self._commands.put(command)


def dial_console(endpoint: str, *, role: str, actor_id: int = 0, console_key: str = "",
                 own_secret_key=None, allow_insecure: bool = False) -> ConsoleLink | None:
    """A :class:`ConsoleLink` to ``endpoint`` (not started), or None without one. With
    ``console_key`` (the console's public key file) the link is CurveZMQ and presents
    ``own_secret_key``, the learner's or the actor's own."""
    if not endpoint:
        return None
    keys = None
    if console_key:
        if own_secret_key is None:
            raise ValueError("console_key: a CurveZMQ console needs this process's own secret key (--secret-key)")
        keys = ClientKeys(Path(own_secret_key), Path(console_key))
    return ConsoleLink(endpoint, role=role, actor_id=actor_id, keys=keys, allow_insecure=allow_insecure)
