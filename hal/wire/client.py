"""The actor's side of the link: one DEALER socket that dials the learner.

No call waits without a deadline. Step batches go into a :class:`Spool`
first and leave it only when the learner acknowledges them (committed to its
replay), so a dead link or a restarted learner loses nothing: the link
learns from WELCOME which batches the learner already holds, and resends the
rest in order. Credits (rows the learner will take) gate what is sent; what
is not yet sent waits in the spool.

One socket for the link's life, so every reply reaches it: the learner's
ROUTER knows a connection by the identity it gave it, and a socket the actor
closes takes its WELCOME, ACKs and credits with it. ZeroMQ reconnects the
socket by itself (backoff ``reconnect_s`` doubling to ``reconnect_max_s``;
its own heartbeats drop a dead connection after ``peer_timeout_s``), queues
nothing while there is no connection (``IMMEDIATE``: no stale batch reaches a
restarted learner, no send blocks), and reports each lost connection: the
next one is a new identity at the learner, so HELLO goes out on it at once.
A learner that says nothing for ``peer_timeout_s`` on a live connection (its
loop stalled, or it dropped our session) is sent HELLO again there, once per
``peer_timeout_s``. A link that itself said nothing for longer than the
learner keeps a silent session (WELCOME's ``peer_timeout_s``: an actor, or a
model's rank, busy elsewhere for minutes) has lost its session and says
HELLO again before anything else; the spool resends what was not committed.
:meth:`LearnerLink.drain` is an actor's final flush.

The first handshake never waits in silence: the same monitor that reports lost connections
tells :class:`~.security.HandshakeWatch` how the handshake went, so a cause ZeroMQ makes certain
(our key not authorised, the wrong learner key, keys on one side only) raises
:class:`HandshakeFailed` at once, as a refusal does; silence is named in one line (``on_hint``)
after ``hint_after_s``, and the link keeps trying until ``handshake_timeout_s``.
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
from .security import (
    HANDSHAKE_EVENTS,
    HINT_AFTER_S,
    ClientKeys,
    HandshakeWatch,
    check_endpoint,
    secure_client,
)
from .spool import Spool

BYE_LINGER_MS = 200
"""How long closing waits for a queued BYE to leave (a learner that is gone costs no more than this)."""
RETRY_REFUSED_S = 0.5
"""How soon a link refused for now (its index still held by a session the learner heard lately,
say its own killed predecessor's) says HELLO again."""
HEARTBEAT_S = 1.0
"""How often a connected link says something (a batch, else a heartbeat) when it is polled: the
learner counts a session silent for a few of these as gone (the index may then be taken over)."""


class LinkError(RuntimeError):
    """The learner refused us, or never answered the first handshake."""


class HandshakeFailed(LinkError):
    """The first handshake failed for a certain cause: the learner refused us (REFUSED, BYE), or
    ZeroMQ saw the CurveZMQ handshake fail. Trying longer would not help."""


class Undelivered(LinkError):
    """The link stopped trying with batches the learner never acknowledged (still in its spool)."""

    def __init__(self, reason: str, spool: Spool):
        self.rows, self.batches = spool.rows, len(spool)
        if spool.directory is not None:
            where = (f"they are kept in the spool at {spool.directory}: this actor restarted on it "
                     "(same index, same actor.spool_dir) delivers them")
        else:
            where = "the spool is in memory only, so they are lost (set actor.spool_dir to keep them)"
        super().__init__(f"{reason}: {self.rows} rows in {self.batches} "
                         f"batch{'es' if self.batches != 1 else ''} unacknowledged; {where}")


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
                 handshake_timeout_s: float = 60.0, heartbeat_s: float = HEARTBEAT_S,
                 peer_timeout_s: float = 30.0, reconnect_s: float = 0.5, reconnect_max_s: float = 10.0,
                 limits: Limits = DEFAULT_LIMITS, spool: Spool | None = None,
                 keys: ClientKeys | None = None, allow_insecure: bool = False,
                 compression: str = "auto", on_sent: Callable[[int, Steps], None] | None = None,
                 policy_graphs: bool = False, hint_after_s: float = HINT_AFTER_S,
                 on_hint: Callable[[str], None] | None = None, relay: bool = False):
        """``on_sent(seq, steps)``: called for every batch the link takes (e.g. a batch ledger).
        ``on_hint(line)``: how ``connect()`` says what is likely wrong after ``hint_after_s`` without
        a WELCOME (default: a line on stderr).
        ``policy_graphs``: ask the learner for each device's policy export (an actor without JAX acts
        with :class:`~embodyrl.hal.runtime.NumpyPolicy`); WELCOME's answer is in :attr:`policy_exports`.
        ``relay``: a relay's own session (no devices; it takes weights for the actors behind it)."""
        check_endpoint(endpoint, keys is not None, allow_insecure)
        self.endpoint = endpoint
        """Where the link is dialled now: the learner's endpoint, or the ingest port it named."""
        self.learner_endpoint = endpoint
        """The learner's own endpoint: dialled again whenever a session at an ingest port ends, so a
        restarted ingest worker on a new port is found the same way as the first."""
        self._redirect: str | None = None
        self._dialled_at = 0.0
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
        self._waiting_for: str | None = None
        """The newest refusal the learner said may pass (an index another session still holds):
        HELLO again after ``RETRY_REFUSED_S`` until the handshake deadline."""
        self.policy_graphs = policy_graphs
        self.relay = relay
        self.weights_checksum: str | None = None
        """The checksum of the weights held, as verified on arrival (None: lossy weights, none verified)."""
        self.hint_after_s = hint_after_s
        self.on_hint = on_hint
        self._handshake: HandshakeWatch | None = None
        self.policy_exports: dict[int, tuple[dict, dict[str, np.ndarray]] | str] = {}
        """With ``policy_graphs``, from the latest WELCOME: device id -> ``(meta, arrays)`` of its policy
        export, or the learner's reason for sending none."""
        self.connected = False
        self.held_version: PolicyVersion = NO_POLICY
        """The newest weights version this link has rebuilt (the learner's delta base)."""
        self._socket: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None  # tells when the socket's connection drops
        self._credits = 0
        self._seq = self.spool.last_seq
        self._acked_seq = 0
        self._sent_upto = 0
        self._sent_at: dict[int, float] = {}
        self._weights: tuple[PolicyVersion, dict[str, np.ndarray]] | None = None
        self._base: tuple[PolicyVersion, dict[str, np.ndarray]] | None = None
        self._last_heard = self._last_sent = 0.0
        self._learner_timeout_s = peer_timeout_s
        """How long the learner keeps a silent session (its WELCOME says): a link that did not poll
        for longer, say a model busy elsewhere, has lost its session and says HELLO again."""
        self._next_hello = 0.0  # while not connected: when HELLO is (re)sent, if the transport takes it
        self.instance = secrets.token_hex(8)
        """This link's token in every HELLO: a reconnect of the same link replaces its session at
        the learner; a second process started with the same actor id is refused."""

    # -- lifecycle -------------------------------------------------------
    def connect(self) -> None:
        """Dial the learner and complete the first handshake, or raise LinkError
        (:class:`HandshakeFailed` when the cause is certain)."""
        self._handshake = watch = HandshakeWatch(self.endpoint, self.keys, self.handshake_timeout_s,
                                                 hint_after_s=self.hint_after_s, say=self.on_hint,
                                                 server="the learner")
        self._dial()
        deadline = time.monotonic() + self.handshake_timeout_s
        while not self.connected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close(send_bye=False)
                if self._waiting_for is not None:  # refused for now, every time: say why
                    raise LinkError(f"learner at {self.endpoint} refused us: {self._waiting_for}")
                raise LinkError(f"no WELCOME from {self.endpoint} within {self.handshake_timeout_s} s: "
                                f"{watch.causes()}")
            self._hello()
            due = time.monotonic() >= self._next_hello  # HELLO not out yet: the transport is still connecting
            self._receive(timeout_ms=1 if due else int(min(remaining, 0.02) * 1000))
            if self.bye_reason is not None and not self.connected:  # welcomed, then told the run is over:
                self.close(send_bye=False)  # connected, and the actor's loop ends on the goodbye
                raise HandshakeFailed(f"learner at {self.endpoint} refused us: {self.bye_reason}")
            if watch.failure is not None:
                self.close(send_bye=False)
                raise HandshakeFailed(f"no WELCOME from {self.endpoint}: {watch.failure}")
            watch.waiting()

    def close(self, reason: str = "done", *, send_bye: bool = True) -> None:
        if self._socket is None:
            return
        said_bye = False
        if send_bye and self.connected:
            with contextlib.suppress(zmq.ZMQError):
                self._send(P.BYE, {"reason": reason})
                said_bye = True
        self._close_socket(said_bye)

    def _close_socket(self, said_bye: bool = False) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._socket.disable_monitor()
        self._monitor.close(linger=0)
        # linger 0 could drop the BYE still queued: the learner would keep the session, and send to a
        # connection that is gone, until our silence timed out
        self._socket.close(linger=BYE_LINGER_MS if said_bye else 0)
        self._socket = self._monitor = None
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
        """Handle arrivals (waiting at most ``timeout_ms``), send what credits allow, keep the
        link alive, and say HELLO again on a new connection or after the learner's silence."""
        if self._socket is None:
            raise LinkError("link is closed")
        self._receive(timeout_ms)
        now = time.monotonic()
        if self.connected and now - self._last_heard > self.peer_timeout_s:
            self._disconnect()
        if self.connected and now - self._last_sent > self._learner_timeout_s:
            self._disconnect()  # we were silent longer than the learner waits: it has ended our session
        if not self.connected:
            if self.endpoint != self.learner_endpoint and now - self._dialled_at > self.peer_timeout_s:
                self._redial(self.learner_endpoint)  # no session at the ingest port: ask the learner again
            self._hello()
            return
        self._pump()
        if self.connected and now - self._last_sent >= self.heartbeat_s:
            self._send(P.HEARTBEAT, {"time": time.time(), "held": list(self.held_version)})

    def flush(self, timeout_s: float, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Keep polling (resending across reconnects) until the learner has acknowledged every
        spooled batch, it says goodbye, ``should_stop()`` or time runs out; True if nothing is left."""
        deadline = time.monotonic() + timeout_s
        while len(self.spool) and time.monotonic() < deadline and self.bye_reason is None and not should_stop():
            self.poll(20)
        return len(self.spool) == 0

    def drain(self, timeout_s: float, should_stop: Callable[[], bool] = lambda: False) -> None:
        """An actor's last flush: return once the learner holds every spooled batch, or raise
        :class:`Undelivered` saying what the spool still holds. A learner's BYE ends it quietly:
        the learner ended the run (what it did not take stays in the spool)."""
        started = time.monotonic()
        if self.flush(timeout_s, should_stop) or self.bye_reason is not None:
            return
        how = "a second stop signal" if should_stop() else f"{time.monotonic() - started:.0f} s"
        raise Undelivered(f"gave up on {self.endpoint} after {how} (actor.flush_timeout_s = {timeout_s:g})",
                          self.spool)

    @property
    def socket(self) -> zmq.Socket | None:
        """The link's one socket (after :meth:`connect`), for a ``zmq.Poller`` that waits on it beside
        others; :meth:`poll` still does the work."""
        return self._socket

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
        """Open the link's one socket; HELLO goes out once the transport has a connection."""
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes + self.limits.max_header_bytes)
        sock.setsockopt(zmq.SNDHWM, 64)
        sock.setsockopt(zmq.RCVHWM, 64)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # nothing queued without a connection: sends fail fast instead
        sock.setsockopt(zmq.RECONNECT_IVL, max(int(self.reconnect_s * 1000), 1))
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, max(int(self.reconnect_max_s * 1000), 1))
        sock.setsockopt(zmq.HEARTBEAT_IVL, max(int(self.heartbeat_s * 1000), 1))  # answered by the
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(int(self.peer_timeout_s * 1000), 1))  # learner's I/O thread
        if self.keys is not None:
            secure_client(sock, self.keys)
        self._monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
        sock.connect(self.endpoint)
        self._dialled_at = time.monotonic()
        self._socket = sock
        self._credits = 0
        self._last_heard = time.monotonic()
        self._next_hello = 0.0

    def _hello(self) -> None:
        """Say HELLO if one is due and the transport takes it (else the next poll tries again);
        WELCOME arrives through poll."""
        now = time.monotonic()
        if self.connected or now < self._next_hello or not self._socket.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
            return  # POLLOUT: the transport has a connection (IMMEDIATE) with room
        if self._send(P.HELLO, {
            "actor": self.actor_name, "actor_id": self.actor_id,
            "devices": [d.to_msg() for d in self.devices], "last_acked_seq": self._acked_seq,
            "held": list(self.held_version), "protocol": PROTOCOL_VERSION, "instance": self.instance,
            **({"policy_graphs": True} if self.policy_graphs else {}), **({"relay": True} if self.relay else {}),
        }, protocol=P.HELLO_PROTOCOL):  # readable by a learner of any version, which then answers
            self._next_hello = now + self.peer_timeout_s  # unanswered on a live connection: again

    def _disconnect(self) -> None:
        """The session is gone (silence, or its connection closed): HELLO again at once (at an ingest
        port, to the learner's own endpoint, which names the port again)."""
        if self.connected:
            self.stats.reconnects += 1
        self.connected = False
        self._credits = 0
        self._next_hello = 0.0
        if self.endpoint != self.learner_endpoint:
            self._redial(self.learner_endpoint)

    def _redial(self, endpoint: str) -> None:
        """Close the socket and dial ``endpoint`` (an ingest port the learner named, or the learner)."""
        self._close_socket()
        self.endpoint = endpoint
        self._dial()

    def _watch(self) -> None:
        """A dropped connection ends the session: the next one is a new identity at the learner.
        The handshake's events go to the watch (``connect()`` reads its verdict)."""
        if zmq.EVENT_DISCONNECTED in self._handshake.read(self._monitor):
            self._disconnect()

    def _pump(self) -> None:
        """Send spooled batches in seq order while credits last."""
        if not self.connected:
            return
        for seq in self.spool.seqs_after(self._sent_upto):
            rows = self.spool.rows_of(seq)
            if rows > self._credits:
                break
            frames = self.spool.frames(seq)
            try:
                self._socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.Again:  # no connection, or its queue is full: the next poll goes on
                break
            if seq in self._sent_at:
                self.stats.resent_batches += 1
            self._sent_at[seq] = time.monotonic()
            self.stats.messages_out += 1
            self.stats.bytes_out += sum(len(f) for f in frames)
            self._last_sent = time.monotonic()
            self._credits -= rows
            self._sent_upto = seq

    def _send(self, kind: str, fields: dict, arrays=None, protocol: int = PROTOCOL_VERSION) -> bool:
        """Send now or not at all (no connection, or its queue full); whether it went."""
        try:
            self._socket.send_multipart(encode(kind, fields, arrays, protocol=protocol), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self._last_sent = time.monotonic()
        return True

    def _receive(self, timeout_ms: int) -> None:
        """Handle what arrived, then connection events (what came before a drop was sent before it)."""
        sock = self._socket
        while sock.poll(timeout_ms, zmq.POLLIN):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            timeout_ms = 0
            self._last_heard = time.monotonic()
            self.stats.messages_in += 1
            self.stats.bytes_in += sum(len(f) for f in frames)
            try:
                self._dispatch(decode(frames, self.limits))
            except MessageError as err:
                self.stats.rejected[err.reason] = self.stats.rejected.get(err.reason, 0) + 1
            if self._redirect is not None:
                target, self._redirect = self._redirect, None
                self._redial(target)
                return
        self._watch()

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
            self.weights_checksum = P.field(f, "checksum", str) if encoding in (W.FULL, W.DELTA) else None
        except (W.WeightsError, ValueError) as err:
            self._base = None
            self.held_version = NO_POLICY  # the learner answers with full weights
            raise MessageError("weights", str(err)) from None
        self._base = (version, full)
        self.held_version = version
        self._weights = (version, full)
        if self.relay:  # say so at once: the learner sends newer weights only to a link that holds the
            # last it sent, and a relay sends no batches to say it with (an actor's next batch does;
            # saying it at once there too would have it decode every publication, on a simulator's CPU)
            self._send(P.HEARTBEAT, {"time": time.time(), "held": list(version)})

    def _dispatch(self, msg) -> None:
        f = msg.fields
        if msg.kind == P.ACK:
            if self.connected:  # only a WELCOME's run numbers our batches (the next WELCOME repeats a missed ACK)
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
            run_id = P.field(f, "run_id", str)
            if len(self.spool) and self.spool.run not in (None, run_id):
                # its acknowledgements number another run's batches: they would delete ours unsent
                self.bye_reason = (f"the learner at {self.endpoint} serves run {run_id!r}; this actor's spool "
                                   f"holds {self.spool.rows} rows for run {self.spool.run!r}, kept unsent "
                                   f"(start that run's learner, or move the spool away to join this one)")
                self.stats.rejected["run"] = self.stats.rejected.get("run", 0) + 1
                return
            self.run_id = self.spool.run = run_id
            self.incarnation = P.field(f, "incarnation", int)
            self._credits = P.field(f, "credits", int)
            timeout = f.get("peer_timeout_s")
            if type(timeout) in (int, float) and timeout > 0:  # learners before it sent none: ours stands
                self._learner_timeout_s = float(timeout)
            if self.policy_graphs:
                self.policy_exports = P.policy_exports(f, msg.arrays, [d.device_id for d in self.devices])
            self._acknowledge(committed)
            self._seq = max(self._seq, committed)
            self._sent_upto = committed  # everything after it is resent, in order
            self.connected = True
            self._waiting_for = None
        elif msg.kind == P.REFUSED and "ingest_port" in f:  # the learner ingests this index elsewhere
            self._redirect = P.ingest_endpoint(self.learner_endpoint, P.field(f, "ingest_port", int))
        elif msg.kind == P.REFUSED and f.get("retry") is True:
            self._waiting_for = P.field(f, "reason", str)
            self._next_hello = time.monotonic() + RETRY_REFUSED_S
        elif msg.kind == P.BYE and f.get("restart") is True:  # the run goes on: keep the spool, dial again
            self._send(P.BYE, {"reason": "dialling again"})
            self._disconnect()
            self._next_hello = time.monotonic() + RETRY_REFUSED_S
        elif msg.kind in (P.REFUSED, P.BYE):
            self.bye_reason = P.field(f, "reason", str)
        elif msg.kind == P.HEARTBEAT:
            pass
        else:
            raise MessageError("kind", f"unexpected {msg.kind!r} from the learner")
