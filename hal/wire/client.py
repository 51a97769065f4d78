"""The actor's side of the link: one DEALER socket that dials the learner.

Every call returns within its deadline. The link tracks credits (how many
step rows the learner will take), unacknowledged batches, the newest weights
received, and when the learner was last heard from.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict

import numpy as np
import zmq

from ..steps import NO_POLICY, PolicyVersion, Steps
from . import protocol as P
from .codec import DEFAULT_LIMITS, PROTOCOL_VERSION, Limits, MessageError, decode, encode
from .security import ClientKeys, check_endpoint, secure_client


class LinkError(RuntimeError):
    """The learner refused us, went silent past the deadline, or said goodbye."""


class LearnerLink:
    def __init__(self, endpoint: str, *, actor_name: str, actor_id: int,
                 devices: list[P.DeviceInfo], context: zmq.Context | None = None,
                 handshake_timeout_s: float = 60.0, heartbeat_s: float = 1.0,
                 peer_timeout_s: float = 30.0, limits: Limits = DEFAULT_LIMITS,
                 keys: ClientKeys | None = None, allow_insecure: bool = False):
        check_endpoint(endpoint, keys is not None, allow_insecure)
        self.endpoint = endpoint
        self.actor_name = actor_name
        self.actor_id = actor_id
        self.devices = devices
        self._context = context or zmq.Context.instance()
        self.handshake_timeout_s = handshake_timeout_s
        self.heartbeat_s = heartbeat_s
        self.peer_timeout_s = peer_timeout_s
        self.limits = limits
        self.keys = keys
        self._socket: zmq.Socket | None = None
        self.credits = 0
        self.run_id: str | None = None
        self.incarnation: int | None = None
        self.bye_reason: str | None = None
        self._seq = 0
        self._acked_seq = 0
        self._unacked: OrderedDict[int, int] = OrderedDict()  # seq -> rows
        self._weights: tuple[PolicyVersion, dict[str, np.ndarray]] | None = None
        self.held_version: PolicyVersion = NO_POLICY
        """The weights version the actor acts with; set it when it loads new weights."""
        self._last_heard = 0.0
        self._last_sent = 0.0
        self.rejected: dict[str, int] = {}

    # -- lifecycle -------------------------------------------------------
    def connect(self) -> None:
        """Dial the learner and complete the handshake, or raise LinkError."""
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes + self.limits.max_header_bytes)
        sock.setsockopt(zmq.SNDHWM, 64)
        sock.setsockopt(zmq.RCVHWM, 64)
        if self.keys is not None:
            secure_client(sock, self.keys)
        sock.connect(self.endpoint)
        self._socket = sock
        self._send(P.HELLO, {
            "actor": self.actor_name, "actor_id": self.actor_id,
            "devices": [d.to_msg() for d in self.devices], "last_acked_seq": self._acked_seq,
            "held": list(self.held_version),
        })
        deadline = time.monotonic() + self.handshake_timeout_s
        while self.run_id is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close(send_bye=False)
                hint = " (is our key authorised there?)" if self.keys is not None else ""
                raise LinkError(f"no WELCOME from {self.endpoint} within {self.handshake_timeout_s} s{hint}")
            self._receive(timeout_ms=int(min(remaining, 0.1) * 1000))
            if self.bye_reason is not None:
                self.close(send_bye=False)
                raise LinkError(f"learner at {self.endpoint} refused us: {self.bye_reason}")

    def close(self, reason: str = "done", *, send_bye: bool = True) -> None:
        if self._socket is None:
            return
        if send_bye:
            with contextlib.suppress(zmq.ZMQError):
                self._send(P.BYE, {"reason": reason})
        self._socket.close(linger=0)
        self._socket = None

    def __enter__(self) -> LearnerLink:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- traffic ---------------------------------------------------------
    def send_steps(self, device_id: int, steps: Steps) -> int:
        """Send one batch of steps, spending credits; return its sequence number."""
        if len(steps) > self.credits:
            raise LinkError(f"{len(steps)} rows exceed the {self.credits} credits held")
        self._seq += 1
        fields = {"seq": self._seq, "device_id": device_id, "held": list(self.held_version)}
        self._send(P.STEPS, fields, steps.arrays())
        self.credits -= len(steps)
        self._unacked[self._seq] = len(steps)
        return self._seq

    def poll(self, timeout_ms: int = 0) -> None:
        """Handle what has arrived (waiting at most ``timeout_ms``) and keep the link alive.

        Raises LinkError if the learner has been silent past ``peer_timeout_s``.
        """
        self._receive(timeout_ms)
        now = time.monotonic()
        if now - self._last_sent >= self.heartbeat_s:
            self._send(P.HEARTBEAT, {"time": time.time()})
        if now - self._last_heard > self.peer_timeout_s:
            raise LinkError(f"learner at {self.endpoint} silent for {now - self._last_heard:.1f} s")

    def take_weights(self) -> tuple[PolicyVersion, dict[str, np.ndarray]] | None:
        """The newest weights received since the last call, if any."""
        weights, self._weights = self._weights, None
        return weights

    @property
    def unacked_rows(self) -> int:
        return sum(self._unacked.values())

    @property
    def acked_seq(self) -> int:
        return self._acked_seq

    # -- internals -------------------------------------------------------
    def _send(self, kind: str, fields: dict, arrays=None) -> None:
        self._socket.send_multipart(encode(kind, fields, arrays), copy=False)
        self._last_sent = time.monotonic()

    def _receive(self, timeout_ms: int) -> None:
        sock = self._socket
        if sock is None:
            raise LinkError("link is closed")
        if not sock.poll(timeout_ms, zmq.POLLIN):
            return
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            try:
                self._dispatch(decode(frames, self.limits))
            except MessageError as err:
                self.rejected[err.reason] = self.rejected.get(err.reason, 0) + 1

    def _dispatch(self, msg) -> None:
        f = msg.fields
        if msg.kind == P.ACK:
            seq = P.field(f, "seq", int)
            self.credits += P.field(f, "credits", int)
            while self._unacked and next(iter(self._unacked)) <= seq:
                self._unacked.popitem(last=False)
            self._acked_seq = max(self._acked_seq, seq)
        elif msg.kind == P.WEIGHTS:
            self._weights = (P.version_field(f), dict(msg.arrays))
        elif msg.kind == P.WELCOME:
            if P.field(f, "protocol", int) != PROTOCOL_VERSION:
                raise MessageError("protocol", "learner speaks another protocol")
            self.run_id = P.field(f, "run_id", str)
            self.incarnation = P.field(f, "incarnation", int)
            self.credits += P.field(f, "credits", int)
        elif msg.kind in (P.REFUSED, P.BYE):
            self.bye_reason = P.field(f, "reason", str)
        elif msg.kind == P.HEARTBEAT:
            pass
        else:
            raise MessageError("kind", f"unexpected {msg.kind!r} from the learner")
