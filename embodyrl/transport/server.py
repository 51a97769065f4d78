"""The learner's ROUTER socket: handshakes, step ingest, acks, credits, weights.

The server never blocks on one actor. It validates everything it receives
and counts what it refuses by reason, in an order that keeps a hostile peer
cheap: the header first (a peer without a session costs one header parse),
then the declared sizes against the session's limits (derived from the
specs its HELLO declared: the largest valid batch with a margin), and only
then the arrays, decompressed at most to their declared size. It drops
batches it has already committed without decoding them, and sends each
actor the newest weights once the actor has caught up with the last ones it
was sent, so a slow actor never queues a backlog of stale weights.

Identity: with CurveZMQ keys, an actor index belongs to a key
(:class:`~.identity.IndexClaims`); a HELLO from the owning key replaces its
session (every reconnect opens a fresh socket), any other key is refused.
Without keys, a HELLO for an index another link instance was heard on within
``duplicate_window_s`` (:data:`DUPLICATE_WINDOW_S`: 3 of the link's heartbeat
intervals, so an actor busy for a second or two between polls keeps its index)
is refused by name and told it may retry: a killed actor's restart waits out
its predecessor's window; two actors started with one ``--index`` go on being
refused until the second's handshake deadline.

Values: a batch is refused before it is stored when any value lies outside
what the task declares (:meth:`~embodyrl.hal.steps.Steps.from_arrays`, with
the task's ``reward_bound``), when a row names a policy incarnation that is
neither this learner's nor an earlier one of its run (``incarnations``:
``unknown_incarnation``), or when its seq jumps further ahead than a link's
spool could have dropped (:data:`MAX_SEQ_JUMP`: ``seq_jump``). Each refusal is
counted by reason, and its message (column, row, value) is kept
(``stats.last_refusal``) and logged.

Runs: a session's consecutive small batches of one device that one poll finds
queued are checked and handed on as one batch, their columns joined, so a
batch's fixed costs (the checks, the replay's append, the bookkeeping) are
paid once a run; a run whose check fails is checked batch by batch, so only a
bad batch is refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import zmq

from ..hal.specs import SpecError
from ..hal.steps import (
    REWARD_BOUND,
    PolicyVersion,
    Steps,
    StepsCheck,
    extremes,
    row_nbytes,
    steps_check,
)
from ..hal.wire import protocol as P
from ..hal.wire import weights as W
from ..hal.wire.client import HEARTBEAT_S
from ..hal.wire.codec import (
    DEFAULT_LIMITS,
    PROTOCOL_VERSION,
    Header,
    HeaderMemo,
    Limits,
    MessageError,
    decode_arrays,
    decode_joined,
    encode,
    parse_header,
)
from ..hal.wire.security import (
    RateLimiter,
    RateLimits,
    ServerKeys,
    ServerSocket,
    check_endpoint,
    peer_key,
)
from .credits import CreditBook
from .followers import Follower
from .identity import IndexClaims
from .publisher import WeightPublisher, WeightsConfig

log = logging.getLogger(__name__)

MAX_BATCH_ROWS = 4096
"""Rows in the largest batch an actor sends, unless the learner says otherwise."""
LIMIT_MARGIN = 1.25
BYE_WAIT_S = 1.0
"""How long :meth:`LearnerServer.bye` keeps serving for the actors to answer the goodbye with theirs.
Closing at once can take the BYE with it: an actor's DEALER (``IMMEDIATE``) drops what it has not
yet read when its connection goes, and that actor runs on, unaware, until its credit times out."""
HANDSHAKE_MS = 10_000
QUIET_HEARTBEATS = 3
DUPLICATE_WINDOW_S = QUIET_HEARTBEATS * HEARTBEAT_S
"""Without keys: how long a session must have been silent before another link may take its index."""
MAX_SEQ_JUMP = 1 << 32
"""The furthest a batch's seq may lie beyond the newest one its actor's session delivered. An honest
link numbers its batches one by one; it skips only the batches its spool dropped while the learner did
not acknowledge them (``on_full="drop_oldest"``): 2**32 of them is 80 days of 625 batches a second.
Beyond it the seq is a forgery (10**12), and acknowledging it would make every honest seq after it a
"resend" (``seq_jump``)."""
LOGGED_EVERY_S = 10.0
"""A refused batch's message is logged at most this often per reason (a flood costs no log spam)."""
DATA_REFUSALS = ("steps_invalid", "unknown_incarnation", "policy_version", "seq_jump")

# Decides whether to admit an actor: returns None to accept or the reason to refuse.
AdmitFn = Callable[[list[P.DeviceInfo]], str | None]


@dataclass
class ActorSession:
    identity: bytes
    name: str
    actor_id: int
    devices: dict[int, P.DeviceInfo]
    limits: Limits = DEFAULT_LIMITS
    """What one of its messages may declare: the largest valid batch of its devices, with a margin."""
    key: str | None = None
    """Its CurveZMQ public key (z85), None on a plain link."""
    instance: str | None = None
    """Its link's token: the same on every reconnect of one actor process."""
    committed_seq: int = 0
    received_seq: int = 0
    """The newest seq handed to the learner on this connection (committed or not yet)."""
    last_heard: float = 0.0
    follower: Follower = field(default_factory=Follower)
    """Its weights: what it holds, what it was sent (:mod:`.followers`)."""
    relayed_by: str | None = None
    """The relay it speaks through (its HELLO's ``relayed_by``): the relay sends it weights, not us."""
    relay: bool = False
    """A relay's own session: no devices, no steps; it takes the weights for its actors."""
    rows: int = 0
    checks: dict[int, StepsCheck] = field(default_factory=dict)
    """Device id -> the checks of its batches, worked out from its specs once, at HELLO."""
    headers: HeaderMemo = field(default_factory=HeaderMemo)
    """Its last batch's array descriptors, checked against :attr:`limits`."""


@dataclass
class _Run:
    """A session's consecutive batches of one device, with the same array descriptors, received in
    one poll: admitted, not yet decoded."""
    session: ActorSession
    device_id: int
    header: Header
    """The first batch's: every batch of the run declares the same arrays."""
    seqs: list[int] = field(default_factory=list)
    bodies: list[list] = field(default_factory=list)
    nbytes: int = 0


GATHER_S = 0.001
"""How long a poll that waited, and found a run that could take more batches, lets them arrive: far
below a group commit's interval (acks wait for that anyway), and a few batches of a fast actor,
checked as one run. A large batch is never waited after."""
JOINED_BYTES_MAX = 256 << 10
"""The most a run's joined batches take: small batches' fixed costs (a dozen checks, the replay's
append, the bookkeeping) are paid once for the run; a larger batch's are small beside its bytes,
which joining would copy once more."""


@dataclass(frozen=True)
class ReceivedSteps:
    session: ActorSession
    seq: int
    device_id: int
    steps: Steps


SEND_FAILED, PEER_GONE = "send_failed", "peer_gone"
UNSENT = (SEND_FAILED, PEER_GONE)
"""Counted in ``ServerStats.rejected`` but not refusals: what could not be sent (a reply, or a
heartbeat, weights or goodbye to a connection that was gone)."""


@dataclass
class ServerStats:
    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    duplicates: int = 0
    seq_gaps: int = 0
    redirected: int = 0
    """HELLOs told the ingest port that takes their actor index (:attr:`LearnerServer.placement`)."""
    rejected: dict[str, int] = field(default_factory=dict)
    last_refusal: dict[str, str] = field(default_factory=dict)
    """Reason -> the message of the newest refusal for it (what a refused batch got wrong: column,
    row and value)."""

    def reject(self, reason: str, detail: str | None = None) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if detail is not None:
            self.last_refusal[reason] = detail[:400]


def weights_encodings(fields: dict) -> frozenset[str] | None:
    """The weight encodings a HELLO says its actor decodes (``"weights": ["full", ...]``; None when
    it does not say). ``full`` must be among them: it is what every learner can send."""
    declared = fields.get("weights")
    if declared is None:
        return None
    if type(declared) is not list or not all(type(e) is str for e in declared):
        raise MessageError("field_type", "field 'weights' must be a list of encoding names")
    unknown = sorted(set(declared) - set(W.ENCODINGS))
    if unknown or W.FULL not in declared:
        raise MessageError("field_type", f"field 'weights': {declared} must name {W.FULL!r} and only "
                           f"encodings of {list(W.ENCODINGS)}")
    return frozenset(declared)


def session_limits(devices: list[P.DeviceInfo], max_batch_rows: int, cap: Limits = DEFAULT_LIMITS) -> Limits:
    """The most a STEPS message for ``devices`` can declare: ``max_batch_rows`` of its widest row,
    with a margin, never beyond ``cap``."""
    widths = [row_nbytes(d.observation_spec, d.action_spec) for d in devices] or [(0, 0)]
    row, columns = max(w[0] for w in widths), max(w[1] for w in widths)
    return cap.within(columns, int(row * max_batch_rows * LIMIT_MARGIN) + 4096)


def router_options(limits: Limits) -> dict[int, int]:
    """The options of a ROUTER that actors dial (the learner's, a relay's): an unknown peer is an
    error, no frame beyond the limits, and a peer that never finishes CURVE holds little, briefly."""
    return {zmq.ROUTER_MANDATORY: 1, zmq.MAXMSGSIZE: limits.max_message_bytes + limits.max_header_bytes,
            zmq.RCVHWM: 1024, zmq.SNDHWM: 1024, zmq.HANDSHAKE_IVL: HANDSHAKE_MS}


def hello_limiter(per_key_s: float, total_s: float) -> RateLimiter:
    """HELLOs each key (without keys: each connection) may send, under a global cap; bursts of twice."""
    return RateLimiter(RateLimits(per_key_s, 2 * per_key_s, total_s, 2 * total_s), time.monotonic())


class LearnerServer:
    def __init__(self, bind: str = "tcp://127.0.0.1:*", *, run_id: str, incarnation: int,
                 admit: AdmitFn | None = None, limits: Limits = DEFAULT_LIMITS,
                 max_batch_rows: int = MAX_BATCH_ROWS,
                 peer_timeout_s: float = 30.0, weights_resend_s: float = 5.0,
                 duplicate_window_s: float = DUPLICATE_WINDOW_S, hellos_per_s: float = 5.0,
                 hellos_total_per_s: float = 50.0, max_devices: int = 64,
                 reward_bound: float | Callable[[int], float] = REWARD_BOUND, incarnations: Iterable[int] = (),
                 keys: ServerKeys | None = None, allow_insecure: bool = False,
                 bindings_path=None,
                 committed_seq: Callable[[int], int] | None = None,
                 weights: WeightsConfig | None = None,
                 context: zmq.Context | None = None):
        """``limits``: the most any message may be (the socket refuses larger frames);
        each session gets tighter ones from its specs and ``max_batch_rows``.
        ``duplicate_window_s``: without keys, how recently an index must have been heard
        for a HELLO from another link instance to be refused (:data:`DUPLICATE_WINDOW_S`).
        ``reward_bound``: the largest |reward| a row may carry, or device id -> its task's bound.
        ``incarnations``: earlier learner incarnations of this run (its restarts), whose policy
        versions actors may still act under; rows naming any other (but 0, no policy) are refused.
        ``hellos_per_s``: HELLOs each key (without keys: each connection) may send, under a
        global ``hellos_total_per_s``; ``max_devices``: the most one HELLO may declare. ``bindings_path``: where the key -> index bindings persist."""
        self.run_id = run_id
        self.incarnation = incarnation
        self.admit = admit
        self.committed_seq = committed_seq
        """actor id -> last seq the replay holds (durable across learner restarts)."""
        self.placement: Callable[[int], int | None] | None = None
        """actor index -> the port of the ingest process that takes it, None for this one, 0 while that
        process starts (ingest workers, :mod:`embodyrl.learner.ingest`); a HELLO for another is told the
        port (REFUSED, ``ingest_port``), where its link dials next."""
        self.policy_graphs: Callable[[int], tuple[dict, dict[str, np.ndarray]]] | None = None
        """device id -> its policy's numpy-runtime export, for a HELLO that asks (an actor without JAX;
        :class:`embodyrl.learner.policy_graphs.PolicyGraphs`); ValueError: none, and why."""
        self.limits = limits
        self.max_batch_rows = max_batch_rows
        self.peer_timeout_s = peer_timeout_s
        self.weights_resend_s = weights_resend_s
        self.duplicate_window_s = duplicate_window_s
        self.reward_bound = reward_bound if callable(reward_bound) else (lambda device_id: reward_bound)
        self.incarnations: frozenset[int] = frozenset()
        self.know_incarnations((0, incarnation, *incarnations))
        self._logged: dict[str, float] = {}  # reason -> when a refusal of it was last logged
        self.max_devices = max_devices
        self._own_published = 0  # version (incarnation, 0) is the learner's initial policy, published or not
        self.claims = IndexClaims(keys.authorized_dir, bindings_path) if keys is not None else None
        self.hello_rate = hello_limiter(hellos_per_s, hellos_total_per_s)
        check_endpoint(bind, keys is not None, allow_insecure)
        self._server = ServerSocket(bind, keys, context=context, options=router_options(limits))
        self._socket = self._server.socket
        self.endpoint: str = self._server.endpoint
        self.sessions: dict[bytes, ActorSession] = {}
        self.stats = ServerStats()
        self.credits = CreditBook()
        self.publisher = WeightPublisher(weights or WeightsConfig())
        self._io_last: dict = {}  # counters at the previous metrics(), for per-second rates

    def close(self) -> None:
        self._server.close()

    @property
    def socket(self) -> zmq.Socket:
        """The ROUTER actors dial (to wait on it beside other sockets)."""
        return self._socket

    def actor_sessions(self) -> int:
        """Sessions that send steps (a relay's own session sends none)."""
        return sum(1 for s in self.sessions.values() if s.devices)

    # -- receiving -------------------------------------------------------
    def poll(self, timeout_ms: int = 0, max_messages: int = 256) -> list[ReceivedSteps]:
        """Handle up to ``max_messages`` arrivals; return the new step batches. A session's consecutive
        batches of one device are checked and returned as one (:class:`_Run`)."""
        received: list[ReceivedSteps] = []
        if not self._socket.poll(timeout_ms, zmq.POLLIN):
            self._expire_sessions()
            return received
        runs: dict[bytes, _Run] = {}
        gather = timeout_ms > 0  # woken by an arrival: small batches sent with it may be on their way
        for _ in range(max_messages):
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                if not (gather and any(run.nbytes < JOINED_BYTES_MAX for run in runs.values())):
                    break
                gather = False  # once: let them arrive, to join their run
                time.sleep(GATHER_S)
                continue
            self.stats.messages_in += 1
            self.stats.bytes_in += sum(len(f) for f in frames)
            identity, body = frames[0].bytes, frames[1:]
            try:
                self._handle(identity, body, runs, received)
            except MessageError as err:
                self._refused(err)
        for run in runs.values():
            self._take_run(run, received)
        self._expire_sessions()
        return received

    def _refused(self, err: MessageError) -> None:
        self.stats.reject(err.reason, err.detail)
        self._log_refusal(err)

    def _handle(self, identity: bytes, body: list, runs: dict[bytes, _Run], received: list) -> None:
        session = self.sessions.get(identity)
        header = parse_header(body, self.limits) if session is None else \
            parse_header(body, session.limits, session.headers)
        if session is not None and header.kind == P.STEPS:
            session.last_heard = time.monotonic()
            self._steps(session, header, body, runs, received)
            return
        if identity in runs:  # its batches before what follows them
            self._take_run(runs.pop(identity), received)
        if header.kind == P.HELLO:
            if header.arrays:
                raise MessageError("header_malformed", "HELLO carries no arrays")
            self._hello(identity, peer_key(body[0]), header.fields, header.protocol)
            return
        if session is None:
            raise MessageError("unknown_peer", f"{header.kind} before HELLO")
        session.last_heard = time.monotonic()
        if header.kind == P.BYE:
            self._end_session(identity)
        elif header.kind == P.HEARTBEAT:
            if "held" in header.fields:
                session.follower.note_held(self._held(header.fields))
                self._maybe_send_weights(session)
        else:
            raise MessageError("kind", f"unexpected {header.kind!r} from an actor")

    def _hello(self, identity: bytes, key: str | None, f: dict, written_in: int) -> None:
        # the rate first, by key (or, without keys, by connection): a flood spends a dict lookup each
        if not self.hello_rate.allow(key if key is not None else identity, time.monotonic()):
            raise MessageError("hello_rate", "too many HELLOs: dropped unanswered")
        instance = f.get("instance") if type(f.get("instance")) is str else None
        peer = f.get("protocol", written_in)  # actors before protocol 2 send no field: their header's
        refusal = P.version_mismatch(peer, "actor", "learner")
        if refusal is not None:  # answered in a version it reads, so it stops with this reason
            self._send(identity, P.REFUSED, {"reason": refusal}, protocol=P.reply_protocol(peer))
            self.stats.reject("protocol")
            return
        name, actor_id = P.field(f, "actor", str), P.field(f, "actor_id", int)
        encodings = weights_encodings(f)
        declared = P.field(f, "devices", list)
        if len(declared) > self.max_devices:
            raise MessageError("too_many_devices", f"{len(declared)} devices in HELLO, at most {self.max_devices}")
        devices = [P.DeviceInfo.from_msg(d) for d in declared]
        if actor_id < 0 and devices:  # negative ids are the learner's own (demonstrations: -1) and relays'
            raise MessageError("field_type", f"actor_id {actor_id}: an actor with devices has an id >= 0")
        relay, relayed_by = f.get("relay") is True, f.get("relayed_by")
        if relay and (devices or actor_id > P.RELAY_IDS):
            raise MessageError("field_type", f"a relay's session declares no devices and an id <= {P.RELAY_IDS}")
        if relayed_by is not None and (type(relayed_by) is not str or not 0 < len(relayed_by) <= 256):
            raise MessageError("field_type", "field 'relayed_by' must be a relay's name")
        port = None if relay or self.placement is None else self.placement(actor_id)
        if port == 0:  # its ingest process is starting: ask again shortly
            self._refuse(identity, "ingest_starting", f"the ingest process of actor {actor_id} is starting",
                         retry=True)
            return
        if port is not None:  # another process ingests this index: the actor dials it there
            self._send(identity, P.REFUSED, {"reason": f"actor {actor_id} is ingested at port {port}",
                                             "retry": True, "ingest_port": port})
            self.stats.redirected += 1
            return
        reason = self.admit(devices) if self.admit else None
        if reason is not None:
            self._refuse(identity, "refused", reason)
            return
        previous = next((s for s in self.sessions.values() if s.actor_id == actor_id), None)
        now = time.monotonic()
        if key is not None and self.claims is not None and not relay:  # a relay's session takes weights only
            reason = self.claims.claim(key, actor_id)
            if reason is not None:
                self._refuse(identity, "index_taken", reason)
                return
        elif (previous is not None and previous.identity != identity and instance != previous.instance
              and now - previous.last_heard < self.duplicate_window_s):
            self._refuse(identity, "index_in_use",
                         f"actor index {actor_id} is in use by another actor ({previous.name!r}, heard "
                         f"{now - previous.last_heard:.2f} s ago): give each actor its own --index",
                         retry=True)  # a killed actor's restart waits out its predecessor's window
            return
        session = ActorSession(identity, name, actor_id, {d.device_id: d for d in devices},
                               limits=session_limits(devices, self.max_batch_rows, self.limits),
                               key=key, instance=instance, last_heard=now,
                               follower=Follower(held=self._held(f), encodings=encodings),
                               relay=relay, relayed_by=relayed_by,
                               checks={d.device_id: steps_check(d.observation_spec, d.action_spec) for d in devices})
        if previous is not None:  # a reconnect: keep its place in the sequence
            session.committed_seq = previous.committed_seq
            self._end_session(previous.identity)
        if self.committed_seq is not None:
            session.committed_seq = max(session.committed_seq, self.committed_seq(actor_id))
        session.received_seq = session.committed_seq
        self.sessions[identity] = session
        welcome = {"protocol": PROTOCOL_VERSION, "run_id": self.run_id, "incarnation": self.incarnation,
                   "credits": 0, "committed_seq": session.committed_seq,
                   "peer_timeout_s": float(self.peer_timeout_s)}
        arrays = self._policy_graphs(welcome, devices) if f.get("policy_graphs") is True else None
        self._send(identity, P.WELCOME, welcome, arrays=arrays)
        self._maybe_send_weights(session)

    def _policy_graphs(self, welcome: dict, devices: list[P.DeviceInfo]) -> dict[str, np.ndarray]:
        """For an actor without JAX: each device's policy export into ``welcome`` (``policies``, or
        ``policy_errors`` saying why not), its arrays returned named ``<device id>/<name>``."""
        policies, errors, arrays = {}, {}, {}
        for device in devices:
            if self.policy_graphs is None:
                errors[str(device.device_id)] = "this learner sends no policy graphs"
                continue
            try:
                meta, named = self.policy_graphs(device.device_id)
            except ValueError as err:
                errors[str(device.device_id)] = str(err)
                continue
            policies[str(device.device_id)] = meta
            arrays.update({f"{device.device_id}/{name}": array for name, array in named.items()})
        welcome["policies"] = policies
        if errors:
            welcome["policy_errors"] = errors
        return arrays

    def _refuse(self, identity: bytes, tag: str, reason: str, *, retry: bool = False) -> None:
        """REFUSED naming ``reason``; ``retry``: it may pass, so the link tries again until its deadline."""
        self._send(identity, P.REFUSED, {"reason": reason, "retry": retry})
        self.stats.reject(tag, reason)

    def _log_refusal(self, err: MessageError) -> None:
        """Log a refused batch's message, once per :data:`LOGGED_EVERY_S` per reason."""
        if err.reason not in DATA_REFUSALS:
            return
        now = time.monotonic()
        if now - self._logged.get(err.reason, -LOGGED_EVERY_S) >= LOGGED_EVERY_S:
            self._logged[err.reason] = now
            log.warning("refused a batch (%s, %d so far): %s", err.reason, self.stats.rejected[err.reason],
                        err.detail[:400])

    def know_incarnations(self, incarnations: Iterable[int]) -> None:
        """Accept rows acted under these learner incarnations too (this run's earlier ones)."""
        self.incarnations = self.incarnations | {int(i) for i in incarnations}
        self._known = np.fromiter(sorted(self.incarnations), np.int64)

    def _held(self, fields: dict) -> PolicyVersion:
        """The version a message says its actor holds; one this learner never published is forged."""
        held = P.version_field(fields, "held")
        if held.incarnation == self.incarnation and held.count > self._published_count():
            raise MessageError("policy_version", f"holds {tuple(held)}, newer than any published")
        return held

    def _published_count(self) -> int:
        """The newest count this learner published under its own incarnation (0: its initial policy)."""
        return self._own_published

    def _steps(self, session: ActorSession, header: Header, body: list, runs: dict[bytes, _Run],
               received: list) -> None:
        """Admit one batch to its session's run (after the batches before it), or drop a resend."""
        seq = P.field(header.fields, "seq", int)
        device_id = P.field(header.fields, "device_id", int)
        session.follower.note_held(self._held(header.fields))
        self._maybe_send_weights(session)
        if device_id not in session.checks:
            raise MessageError("device", f"device {device_id} was not declared in HELLO")
        # the actor spent credit on every batch it sent, whatever becomes of it here (a resend, a refusal)
        rows = next((shape[0] for name, _, shape, _ in header.arrays if name == "reward" and shape), 0)
        self.credits.spent(session.identity, rows)
        run = runs.get(session.identity)
        if run is not None and not 0 < seq - run.seqs[-1] <= MAX_SEQ_JUMP:  # not its run's next batch:
            self._take_run(runs.pop(session.identity), received)  # settle the run, then judge this one
            run = None
        newest = run.seqs[-1] if run is not None else session.received_seq
        if seq <= session.committed_seq:  # a resend after a reconnect: acknowledged, never decoded
            self.stats.duplicates += 1
            self.ack(session, seq)
            return
        if seq <= newest:  # on its way to the replay already
            self.stats.duplicates += 1
            return
        if seq - newest > MAX_SEQ_JUMP:  # never acknowledged: later honest seqs would be "resends"
            raise MessageError("seq_jump", f"seq {seq} of actor {session.actor_id} is {seq - newest} "
                                           f"past its newest, {newest}; a link skips only what its "
                                           f"spool dropped, at most {MAX_SEQ_JUMP}")
        if run is not None and (run.device_id != device_id or run.header.arrays != header.arrays
                                or run.nbytes + header.declared_bytes > JOINED_BYTES_MAX):
            self._take_run(runs.pop(session.identity), received)
            run = None
        if run is None:
            runs[session.identity] = run = _Run(session, device_id, header)
        run.seqs.append(seq)
        run.bodies.append(body)
        run.nbytes += header.declared_bytes

    def _take_run(self, run: _Run, received: list) -> None:
        """Decode and check a run's batches as one (their columns joined: the checks' and the replay's
        fixed costs paid once); if that fails, each on its own, refusing only those at fault."""
        if len(run.seqs) > 1 and (joined := decode_joined(run.header, run.bodies)) is not None:
            try:
                received.append(self._checked(run.session, run.device_id, run.seqs, joined))
                return
            except MessageError:
                pass  # each on its own, below
        for seq, body in zip(run.seqs, run.bodies, strict=True):
            try:
                arrays = decode_arrays(run.header, body).arrays
                received.append(self._checked(run.session, run.device_id, [seq], arrays))
            except MessageError as err:
                self._refused(err)

    def _checked(self, session: ActorSession, device_id: int, seqs: list[int],
                 arrays: dict[str, np.ndarray]) -> ReceivedSteps:
        """The batches ``seqs`` of a session's device (their arrays joined), checked and handed on."""
        try:
            steps = session.checks[device_id].steps(arrays, reward_bound=self.reward_bound(device_id))
        except SpecError as err:
            raise MessageError("steps_invalid", str(err)) from None
        if extremes(steps.actor_id) != (session.actor_id,) * 2 or extremes(steps.device_id) != (device_id,) * 2:
            raise MessageError("steps_invalid", "actor or device ids differ from the session's")
        self._check_versions(steps)
        previous = session.received_seq
        for seq in seqs:  # its spool dropped batches (drop_oldest): counted, not refused
            self.stats.seq_gaps += seq > previous + 1
            previous = seq
        session.received_seq = previous
        return ReceivedSteps(session, previous, device_id, steps)

    def _check_versions(self, steps: Steps) -> None:
        """Every row acted under no policy, or one of this run's learners: none of its own versions
        newer than it published (``policy_version``), no incarnation it never had (``unknown_incarnation``)."""
        incarnation = steps.policy_incarnation
        least, most = extremes(incarnation)
        if least == most and least != self.incarnation and least in self.incarnations:
            return  # every row acted under one earlier incarnation of this run (no count to check)
        if not (least == most == self.incarnation):
            unknown = ~np.isin(incarnation, self._known)
            if unknown.any():
                row = int(np.flatnonzero(unknown)[0])
                raise MessageError("unknown_incarnation", f"policy_incarnation: row {row} holds "
                                   f"{int(incarnation[row])}, an incarnation no learner of this run had")
        forged = (incarnation == self.incarnation) & (steps.policy_count > self._published_count())
        if forged.any():
            row = int(np.flatnonzero(forged)[0])
            raise MessageError("policy_version", f"policy_count: row {row} holds {int(steps.policy_count[row])}, "
                               f"newer than any published ({self._published_count()}; {int(forged.sum())} rows)")

    def _expire_sessions(self) -> None:
        now = time.monotonic()
        for identity, s in list(self.sessions.items()):
            if now - s.last_heard > self.peer_timeout_s:
                self._end_session(identity)

    def _end_session(self, identity: bytes) -> None:
        self.sessions.pop(identity, None)
        self.credits.forget(identity)

    # -- sending ---------------------------------------------------------
    def ack(self, session: ActorSession, seq: int, credits: int = 0) -> None:
        """Tell the actor its batches up to ``seq`` are committed; grant credits. A batch taken on
        a connection the actor has since replaced is acknowledged on its current one."""
        if self.sessions.get(session.identity) is not session:
            session = next((s for s in self.sessions.values() if s.actor_id == session.actor_id), None)
            if session is None:  # gone: its next HELLO learns the committed seq
                return
        session.committed_seq = max(session.committed_seq, seq)
        self.grant(session, credits)

    def grant(self, session: ActorSession, credits: int) -> None:
        """Let the actor send ``credits`` more rows (entered in :attr:`credits`)."""
        if credits:
            self.credits.granted(session.identity, credits)
        self._send(session.identity, P.ACK, {"seq": session.committed_seq, "credits": credits})

    def heartbeat(self) -> None:
        for session in list(self.sessions.values()):
            self._send(session.identity, P.HEARTBEAT, {"time": time.time()}, reply=False)

    def publish(self, version: PolicyVersion, arrays: dict[str, np.ndarray]) -> None:
        """Make ``arrays`` the current weights and send them to actors that are ready."""
        self.publisher.publish(version, arrays)
        if version.incarnation == self.incarnation:
            self._own_published = max(self._own_published, version.count)
        for session in list(self.sessions.values()):
            self._maybe_send_weights(session)

    def _maybe_send_weights(self, session: ActorSession) -> None:
        """Send the current weights unless the actor holds them, others are in flight, or its relay
        serves it (the relay's own session gets them instead)."""
        if session.relayed_by is not None:
            return
        update = session.follower.next_update(self.publisher, self.weights_resend_s)
        if update is not None:
            self._send_frames([session.identity, *update.frames], copy=False, reply=False)

    def metrics(self, now: float) -> dict:
        """Traffic, refusals and weight encodings, with per-second rates since the previous call
        (``now``: seconds on the caller's clock)."""
        st = self.stats
        counts = {"messages_in": st.messages_in, "bytes_in": st.bytes_in,
                  "messages_out": st.messages_out, "bytes_out": st.bytes_out}
        dt = now - self._io_last.get("time", 0.0)
        rates = {f"{k}_per_s": round((v - self._io_last.get(k, 0)) / dt, 1) if dt > 0 else 0.0
                 for k, v in counts.items()}
        self._io_last.update(counts, time=now)
        return {"actors": len(self.sessions), "rejected": sum(st.rejected.values()),
                "rejected_by_reason": dict(st.rejected), **counts, **rates,
                "duplicates_dropped": st.duplicates, "seq_gaps": st.seq_gaps, "redirected": st.redirected, "weights_sent": dict(self.publisher.sent),
                "last_refusal": {k: v for k, v in st.last_refusal.items() if k in DATA_REFUSALS}}

    def bye(self, reason: str, wait_s: float = BYE_WAIT_S, *, restart: bool = False) -> None:
        """Say goodbye to every session, then keep serving until each has answered with its own BYE
        (it has read ours), or ``wait_s`` has passed; a session that begins meanwhile is told too.
        Step batches that arrive meanwhile are neither returned nor acknowledged (the actor's spool
        keeps them). ``restart``: the run is not over (the learner was stopped before its budget):
        actors keep their spools and dial again, as after a learner that died."""
        told: set[bytes] = set()
        deadline = time.monotonic() + wait_s
        fields = {"reason": reason, **({"restart": True} if restart else {})}
        while True:
            for identity in [i for i in self.sessions if i not in told]:
                self._send(identity, P.BYE, fields, reply=False)
                told.add(identity)
            if not self.sessions or time.monotonic() >= deadline:
                return
            self.poll(20)

    def _send(self, identity: bytes, kind: str, fields: dict, protocol: int = PROTOCOL_VERSION, *,
              reply: bool = True, arrays: dict[str, np.ndarray] | None = None) -> None:
        self._send_frames([identity, *encode(kind, fields, arrays, protocol=protocol)], reply=reply)

    def _send_frames(self, frames: list, copy: bool = True, *, reply: bool = True) -> None:
        """``reply``: an answer to what the peer sent (WELCOME, REFUSED, ACK), which must find its
        connection; else a heartbeat, weights or goodbye, which a peer may leave before its BYE or
        silence is read (counted as ``peer_gone``, not ``send_failed``)."""
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK, copy=copy)
        except zmq.ZMQError as err:  # peer gone (ROUTER_MANDATORY) or its queue full
            self.stats.reject(PEER_GONE if not reply and err.errno == zmq.EHOSTUNREACH else SEND_FAILED)
            return
        self.stats.messages_out += 1
        self.stats.bytes_out += sum(memoryview(f).nbytes for f in frames[1:])
