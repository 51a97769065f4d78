"""The actor's side of the link: one DEALER socket that dials the learner.

No call waits without a deadline. Step batches go into a :class:`Spool`
first and leave it only when the learner acknowledges them (committed to its
replay), so a dead link or a restarted learner loses nothing: the link
notices silence (``peer_timeout_s``), reconnects by itself with backoff, learns
from WELCOME which batches the learner already holds, and resends the rest
in order. Credits (rows the learner will take) gate what is sent; what is
not yet sent waits in the spool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from ..dtypes import dtype_from_name
from ..steps import NO_POLICY, PolicyVersion, Steps
from . import protocol as P
from . import weights as W
from .codec import DEFAULT_LIMITS, PROTOCOL_VERSION, Limits, MessageError, decode, encode
from .compression import AdaptiveCompression
from .security import ClientKeys, check_endpoint, secure_client
from .spool import Spool


class LinkError(RuntimeError):
    """The learner refused us, or never answered the first handshake."""


@dataclass
class LinkStats:
    messages_out: int = 0
    bytes_out: int = 0
    messages_in: int = 0
    bytes_in: int = 0
    resent_batches: int = 0
    reconnects: int = 0
    rtt_ms: float | None = None
    rejected: dict[str, int] = field(default_factory=dict)


class LearnerLink:
    def __init__(self, endpoint: str, *, actor_name: str, actor_id: int,
                 devices: list[P.DeviceInfo], context: zmq.Context | None = None,
                 handshake_timeout_s: float = 60.0, heartbeat_s: float = 1.0,
                 peer_timeout_s: float = 30.0, reconnect_s: float = 0.5, reconnect_max_s: float = 10.0,
                 limits: Limits = DEFAULT_LIMITS, spool: Spool | None = None,
                 keys: ClientKeys | None = None, allow_insecure: bool = False,
                 compression: str = "auto", on_sent: Callable[[int, Steps], None] | None = None):
        """``on_sent(seq, steps)``: called for every batch the link takes (e.g. a batch ledger)."""
        check_endpoint(endpoint, keys is not None, allow_insecure)
        self.endpoint = endpoint
        self.actor_name = actor_name
        self.actor_id = actor_id
        self.devices = devices
        self._context = context or zmq.Context.instance()
        self.handshake_timeout_s = handshake_timeout_s
        self.heartbeat_s = heartbeat_s
        self.peer_timeout_s = peer_timeout_s
        self.reconnect_s = reconnect_s
        self.reconnect_max_s = reconnect_max_s
        self.limits = limits
        self.keys = keys
        self.spool = spool if spool is not None else Spool()
        self.compression = AdaptiveCompression(compression)
        self.on_sent = on_sent
        self.stats = LinkStats()
        self.run_id: str | None = None
        self.incarnation: int | None = None
        self.bye_reason: str | None = None
        self.connected = False
        self.held_version: PolicyVersion = NO_POLICY
        """The newest weights version this link has rebuilt (the learner's delta base)."""
        self._socket: zmq.Socket | None = None
        self._credits = 0
        self._seq = self.spool.last_seq
        self._acked_seq = 0
        self._sent_upto = 0
        self._sent_at: dict[int, float] = {}
        self._weights: tuple[PolicyVersion, dict[str, np.ndarray]] | None = None
        self._base: tuple[PolicyVersion, dict[str, np.ndarray]] | None = None
        self._last_heard = self._last_sent = 0.0
        self._backoff = reconnect_s
        self._next_attempt = 0.0
        self.instance = secrets.token_hex(8)
        """This link's token in every HELLO: a reconnect of the same link replaces its session at
        the learner; a second process started with the same actor id is refused."""

    # -- lifecycle -------------------------------------------------------
    def connect(self) -> None:
        """Dial the learner and complete the first handshake, or raise LinkError."""
        self._dial()
        deadline = time.monotonic() + self.handshake_timeout_s
        while not self.connected:
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
        if send_bye and self.connected:
            with contextlib.suppress(zmq.ZMQError):
                self._send(P.BYE, {"reason": reason})
        self._socket.close(linger=0)
        self._socket = None
        self.connected = False

    def __enter__(self) -> LearnerLink:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- traffic ---------------------------------------------------------
    def send_steps(self, device_id: int, steps: Steps) -> int:
        """Spool one batch and send it as soon as credits allow; return its seq.

        Raises :class:`~.spool.SpoolFull` when the spool is full and set to pause.
        """
        seq = self._seq + 1
        arrays = steps.arrays()
        frames = encode(P.STEPS, {"seq": seq, "device_id": device_id, "held": list(self.held_version)},
                        arrays, compression=self.compression.choose(arrays.values()))
        self.spool.push(seq, len(steps), frames)
        self._seq = seq
        if self.on_sent is not None:
            self.on_sent(seq, steps)
        self._pump()
        return seq

    @property
    def credits(self) -> int:
        """Rows that could be sent now beyond what already waits in the spool."""
        return self._credits - self.unsent_rows

    @property
    def unsent_rows(self) -> int:
        return self.spool.rows_after(self._sent_upto)

    @property
    def unacked_rows(self) -> int:
        return self.spool.rows

    @property
    def acked_seq(self) -> int:
        return self._acked_seq

    def poll(self, timeout_ms: int = 0) -> None:
        """Handle arrivals (waiting at most ``timeout_ms``), send what credits allow,
        keep the link alive, and reconnect when the learner has gone silent."""
        if self._socket is None:
            raise LinkError("link is closed")
        self._receive(timeout_ms)
        now = time.monotonic()
        if self.connected and now - self._last_heard > self.peer_timeout_s:
            self._disconnect()
        if not self.connected:
            if now >= self._next_attempt:
                self._dial()
            return
        self._pump()
        if self.connected and now - self._last_sent >= self.heartbeat_s:
            self._send(P.HEARTBEAT, {"time": time.time(), "held": list(self.held_version)})

    def flush(self, timeout_s: float) -> bool:
        """Keep polling until the learner has acknowledged every spooled batch (or time runs out)."""
        deadline = time.monotonic() + timeout_s
        while len(self.spool) and time.monotonic() < deadline and self.bye_reason is None:
            self.poll(20)
        return len(self.spool) == 0

    def take_weights(self) -> tuple[PolicyVersion, dict[str, np.ndarray]] | None:
        """The newest weights received since the last call, if any."""
        weights, self._weights = self._weights, None
        return weights

    def metrics(self) -> dict:
        """Traffic, RTT, resends and reconnects, and the spool's backlog."""
        spool = self.spool
        return {**dataclasses.asdict(self.stats), "spool_batches": len(spool), "spool_rows": spool.rows,
                "spool_bytes": spool.bytes_total, "spool_dropped_rows": spool.dropped_rows}

    # -- internals -------------------------------------------------------
    def _dial(self) -> None:
        """(Re)open the socket and say HELLO; WELCOME arrives through poll."""
        if self._socket is not None:
            self._socket.close(linger=0)
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes + self.limits.max_header_bytes)
        sock.setsockopt(zmq.SNDHWM, 64)
        sock.setsockopt(zmq.RCVHWM, 64)
        if self.keys is not None:
            secure_client(sock, self.keys)
        sock.connect(self.endpoint)
        self._socket = sock
        self._credits = 0
        self._last_heard = time.monotonic()
        self._next_attempt = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.reconnect_max_s)
        self._send(P.HELLO, {
            "actor": self.actor_name, "actor_id": self.actor_id,
            "devices": [d.to_msg() for d in self.devices], "last_acked_seq": self._acked_seq,
            "held": list(self.held_version), "protocol": PROTOCOL_VERSION, "instance": self.instance,
        }, protocol=P.HELLO_PROTOCOL)  # readable by a learner of any version, which then answers

    def _disconnect(self) -> None:
        self.connected = False
        self._credits = 0
        self.stats.reconnects += 1
        self._next_attempt = time.monotonic()

    def _pump(self) -> None:
        """Send spooled batches in seq order while credits last."""
        if not self.connected:
            return
        for seq in self.spool.seqs_after(self._sent_upto):
            rows = self.spool.rows_of(seq)
            if rows > self._credits:
                break
            frames = self.spool.frames(seq)
            self._socket.send_multipart(frames, copy=False)
            if seq in self._sent_at:
                self.stats.resent_batches += 1
            self._sent_at[seq] = time.monotonic()
            self.stats.messages_out += 1
            self.stats.bytes_out += sum(len(f) for f in frames)
            self._last_sent = time.monotonic()
            self._credits -= rows
            self._sent_upto = seq

    def _send(self, kind: str, fields: dict, arrays=None, protocol: int = PROTOCOL_VERSION) -> None:
        self._socket.send_multipart(encode(kind, fields, arrays, protocol=protocol), copy=False)
        self._last_sent = time.monotonic()

    def _receive(self, timeout_ms: int) -> None:
        sock = self._socket
        if not sock.poll(timeout_ms, zmq.POLLIN):
            return
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            self.stats.messages_in += 1
            self.stats.bytes_in += sum(len(f) for f in frames)
            try:
                self._dispatch(decode(frames, self.limits))
            except MessageError as err:
                self.stats.rejected[err.reason] = self.stats.rejected.get(err.reason, 0) + 1

    def _acknowledge(self, seq: int) -> None:
        if seq in self._sent_at:
            elapsed = time.monotonic() - self._sent_at[seq]
            prev = self.stats.rtt_ms
            self.stats.rtt_ms = 1000 * elapsed if prev is None else 0.9 * prev + 100 * elapsed
            if seq == self.spool.first_seq:  # bytes over time to ack: a lower bound of the uplink
                self.compression.note_bandwidth(self.spool.size_of(seq) / max(elapsed, 1e-6))
        for s in [s for s in self._sent_at if s <= seq]:
            del self._sent_at[s]
        self.spool.ack(seq)
        self._acked_seq = max(self._acked_seq, seq)

    def _receive_weights(self, f: dict, arrays: dict) -> None:
        """Rebuild full weights from any encoding and check them against the checksum."""
        version, encoding = P.version_field(f), P.field(f, "encoding", str)
        try:
            if encoding == W.FULL:
                full = dict(arrays)
            elif encoding == W.DELTA:
                base = P.version_field(f, "base")
                if self._base is None or self._base[0] != base:
                    raise W.WeightsError(f"delta against {tuple(base)}, but we hold "
                                         f"{None if self._base is None else tuple(self._base[0])}")
                full = W.apply_delta(self._base[1], arrays)
            elif encoding in (W.BF16, W.INT8):
                dtypes = {k: dtype_from_name(v) for k, v in P.field(f, "dtypes", dict).items()}
                full = W.dequantize(arrays, dtypes)
            else:
                raise W.WeightsError(f"unknown encoding {encoding!r}")
            if encoding in (W.FULL, W.DELTA) and W.checksum(full) != P.field(f, "checksum", str):
                raise W.WeightsError(f"checksum mismatch for {encoding} weights {tuple(version)}")
        except (W.WeightsError, ValueError) as err:
            self._base = None
            self.held_version = NO_POLICY  # the learner answers with full weights
            raise MessageError("weights", str(err)) from None
        self._base = (version, full)
        self.held_version = version
        self._weights = (version, full)

    def _dispatch(self, msg) -> None:
        f = msg.fields
        if msg.kind == P.ACK:
            self._acknowledge(P.field(f, "seq", int))
            self._credits += P.field(f, "credits", int)
        elif msg.kind == P.WEIGHTS:
            self._receive_weights(f, msg.arrays)
        elif msg.kind == P.WELCOME:
            mismatch = P.version_mismatch(P.field(f, "protocol", int), "learner", "actor")
            if mismatch is not None:  # it would refuse every batch: stop, saying why
                self.bye_reason = mismatch
                self.stats.rejected["protocol"] = self.stats.rejected.get("protocol", 0) + 1
                return
            committed = P.field(f, "committed_seq", int)
            self.run_id = P.field(f, "run_id", str)
            self.incarnation = P.field(f, "incarnation", int)
            self._credits = P.field(f, "credits", int)
            self._acknowledge(committed)
            self._seq = max(self._seq, committed)
            self._sent_upto = committed  # everything after it is resent, in order
            self.connected = True
            self._backoff = self.reconnect_s
        elif msg.kind in (P.REFUSED, P.BYE):
            self.bye_reason = P.field(f, "reason", str)
        elif msg.kind == P.HEARTBEAT:
            pass
        else:
            raise MessageError("kind", f"unexpected {msg.kind!r} from the learner")
