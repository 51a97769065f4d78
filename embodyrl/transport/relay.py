"""A relay: each weight publication crosses from the learner to a host or rack once, however many
actors there follow it.

Actors dial the relay as they would the learner (same wire, same keys, same flags). For each actor
connection the relay opens a connection of its own to the learner and passes everything on, both ways,
frame for frame: HELLO (with ``relayed_by`` added, so the learner sends that session no weights),
STEPS, heartbeats and goodbyes up; WELCOME, REFUSED, ACK, heartbeats and goodbyes down. Exactly-once,
credits, index claims and refusals stay the learner's. Weights are the relay's: its own session at the
learner (a :class:`~embodyrl.hal.wire.client.LearnerLink` saying HELLO with ``relay: true``, no
devices, id :func:`~embodyrl.hal.wire.protocol.relay_id`) takes each publication once (full, or a
delta against what the relay holds, checksummed), and the relay serves its actors with the learner's own
rules (:class:`~.followers.Follower`, :class:`~.publisher.WeightPublisher`): an actor gets the
newest once it holds the last it was sent, as a delta against its own version where one pays, full to
a link that declares only full weights, every update with the checksum of the full weights.

The relay keeps nothing that cannot be lost: killed and started again on the same address, its actors
dial it again as they would a restarted learner, and the learner resends what they had not committed.
A learner that is gone or restarting is the same to its actors through a relay as without one.

A peer without a session costs a header parse (and with keys, CurveZMQ first); HELLOs are rate-limited
per key (or connection), and the relay holds at most ``max_peers`` actor connections.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import zmq

from ..hal.wire import protocol as P
from ..hal.wire.client import LearnerLink
from ..hal.wire.codec import DEFAULT_LIMITS, HeaderMemo, Limits, MessageError, encode, parse_header
from ..hal.wire.security import (
    ClientKeys,
    ServerKeys,
    ServerSocket,
    check_endpoint,
    peer_key,
    secure_client,
)
from .followers import Follower
from .identity import IndexClaims
from .publisher import WeightPublisher, WeightsConfig
from .server import hello_limiter, router_options, weights_encodings

log = logging.getLogger(__name__)


@dataclass
class RelayedPeer:
    """One actor connection and the relay's connection to the learner on its behalf."""

    identity: bytes
    upstream: zmq.Socket | None
    actor_id: int
    follower: Follower
    last_heard: float
    welcomed: bool = False
    """The learner admitted it (its WELCOME passed through): only then does it get weights."""
    headers: HeaderMemo = field(default_factory=HeaderMemo)
    dialled: str = ""
    """Where its upstream connection goes: the learner, or the ingest port the learner named for it."""
    hello: list | None = None
    """Its last HELLO as passed up (said again at the ingest port the learner names)."""


@dataclass
class RelayStats:
    messages_up: int = 0
    messages_down: int = 0
    weights_received: int = 0
    weights_sent: int = 0
    weights_bytes_sent: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class Relay:
    def __init__(self, learner: str, bind: str, *, name: str = "relay", index: int = 0,
                 keys: ServerKeys | None = None, learner_keys: ClientKeys | None = None,
                 allow_insecure: bool = False, peer_timeout_s: float = 30.0, weights_resend_s: float = 5.0,
                 max_peers: int = 1024, hellos_per_s: float = 5.0, hellos_total_per_s: float = 50.0,
                 limits: Limits = DEFAULT_LIMITS, weights: WeightsConfig | None = None,
                 handshake_timeout_s: float = 60.0):
        """``keys``: the relay's own server keys and the actors it admits (as a learner's);
        ``learner_keys``: its key pair and the learner's public key, for every connection it makes to the
        learner (list its actors' indices under its key in the learner's ``indices.json``)."""
        check_endpoint(bind, keys is not None, allow_insecure)
        check_endpoint(learner, learner_keys is not None, allow_insecure)
        self.name, self.learner, self.learner_keys = name, learner, learner_keys
        self.peer_timeout_s, self.weights_resend_s, self.max_peers = peer_timeout_s, weights_resend_s, max_peers
        self.limits = limits
        self.link = LearnerLink(learner, actor_name=f"relay {name}", actor_id=P.relay_id(index), devices=[],
                                keys=learner_keys, allow_insecure=allow_insecure, relay=True,
                                peer_timeout_s=peer_timeout_s, handshake_timeout_s=handshake_timeout_s)
        self.publisher = WeightPublisher(weights or WeightsConfig())
        self.claims = IndexClaims(keys.authorized_dir) if keys is not None else None
        self.hello_rate = hello_limiter(hellos_per_s, hellos_total_per_s)
        self._server = ServerSocket(bind, keys, options=router_options(limits))
        self._down = self._server.socket
        self.endpoint: str = self._server.endpoint
        self._context = zmq.Context.instance()
        self.peers: dict[bytes, RelayedPeer] = {}
        self._by_socket: dict[zmq.Socket, RelayedPeer] = {}
        self._poller = zmq.Poller()
        self._poller.register(self._down, zmq.POLLIN)
        self.stats = RelayStats()

    # -- the loop ----------------------------------------------------------------------------------
    def connect(self) -> None:
        """Wait for the learner's WELCOME on the relay's own session (``LinkError`` if it never comes)."""
        self.link.connect()
        self._poller.register(self.link.socket, zmq.POLLIN)  # weights wake the loop at once

    def run(self, should_stop=lambda: False) -> None:
        while not should_stop() and self.link.bye_reason is None:
            self.poll(20)

    def poll(self, timeout_ms: int = 0, max_messages: int = 256) -> None:
        """Pass on what arrived either way (waiting at most ``timeout_ms``), take new weights and
        serve them, drop actors gone quiet."""
        self._take_weights()
        ready = dict(self._poller.poll(timeout_ms))
        if ready.pop(self.link.socket, None):
            self._take_weights()
        if ready.pop(self._down, None):
            self._from_actors(max_messages)
        for socket in ready:
            peer = self._by_socket.get(socket)
            if peer is not None:
                self._from_learner(peer, max_messages)
        self._expire()

    def _take_weights(self) -> None:
        self.link.poll(0)
        weights = self.link.take_weights()
        if weights is not None:
            self.stats.weights_received += 1
            self.publisher.publish(*weights, checksum=self.link.weights_checksum)  # verified on arrival
            for peer in list(self.peers.values()):
                self._maybe_send_weights(peer)

    def drain(self, seconds: float) -> None:
        """Keep passing messages on for ``seconds`` (the learner's goodbyes, the actors' answers)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.peers:
            self.poll(20)

    def close(self) -> None:
        for peer in list(self.peers.values()):
            self._drop(peer)
        self.link.close()
        self._server.close()

    # -- actors -> learner -------------------------------------------------------------------------
    def _from_actors(self, max_messages: int) -> None:
        for _ in range(max_messages):
            try:
                frames = self._down.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity, body = frames[0].bytes, frames[1:]
            try:
                self._from_actor(identity, body)
            except MessageError as err:
                self.stats.reject(err.reason)

    def _from_actor(self, identity: bytes, body: list) -> None:
        peer = self.peers.get(identity)
        header = parse_header(body, self.limits, peer.headers if peer is not None else None)
        if header.kind == P.HELLO:
            self._hello(identity, peer, body, header)
            return
        if peer is None:
            raise MessageError("unknown_peer", f"{header.kind} before HELLO")
        peer.last_heard = time.monotonic()
        if header.kind not in (P.STEPS, P.HEARTBEAT, P.BYE):
            raise MessageError("kind", f"unexpected {header.kind!r} from an actor")
        if "held" in header.fields:
            peer.follower.note_held(P.version_field(header.fields, "held"))
        self._up(peer, body)
        if header.kind == P.BYE:
            self._drop(peer)
        else:
            self._maybe_send_weights(peer)

    def _hello(self, identity: bytes, peer: RelayedPeer | None, body: list, header) -> None:
        key = peer_key(body[0])
        if not self.hello_rate.allow(key if key is not None else identity, time.monotonic()):
            raise MessageError("hello_rate", "too many HELLOs: dropped unanswered")
        f = header.fields
        actor_id = P.field(f, "actor_id", int)
        if f.get("relay") is True:
            raise MessageError("field_type", "a relay dials the learner, not another relay")
        if self.claims is not None and key is not None:
            reason = self.claims.claim(key, actor_id)
            if reason is not None:
                self._down_send([identity, *encode(P.REFUSED, {"reason": reason, "retry": False})])
                self.stats.reject("index_taken")
                return
        held = P.version_field(f, "held") if "held" in f else None
        follower = Follower(held=held, encodings=weights_encodings(f))
        if peer is None:
            if len(self.peers) >= self.max_peers:
                raise MessageError("too_many_peers", f"the relay holds {self.max_peers} actor connections")
            peer = self._open(identity, actor_id, follower)
        else:  # the same connection says HELLO again (the learner went quiet): a fresh session there
            peer.actor_id, peer.follower, peer.welcomed = actor_id, follower, False
            if peer.dialled != self.learner:  # its ingest worker went quiet: the learner names it again
                self._dial(peer, self.learner)
        peer.last_heard = time.monotonic()
        peer.hello = encode(P.HELLO, {**f, "relayed_by": self.name}, protocol=header.protocol)
        self._up(peer, peer.hello)

    def _open(self, identity: bytes, actor_id: int, follower: Follower) -> RelayedPeer:
        peer = RelayedPeer(identity, None, actor_id, follower, time.monotonic())
        self.peers[identity] = peer
        self._dial(peer, self.learner)
        return peer

    def _dial(self, peer: RelayedPeer, endpoint: str) -> None:
        """(Re)open the peer's connection upstream, to the learner or the ingest port it named."""
        if peer.upstream is not None:
            self._close_upstream(peer)
        upstream = self._context.socket(zmq.DEALER)
        upstream.setsockopt(zmq.LINGER, 0)
        upstream.setsockopt(zmq.SNDHWM, 1024)
        upstream.setsockopt(zmq.RCVHWM, 1024)
        if self.learner_keys is not None:
            secure_client(upstream, self.learner_keys)
        upstream.connect(endpoint)
        peer.upstream, peer.dialled = upstream, endpoint
        self._by_socket[upstream] = peer
        self._poller.register(upstream, zmq.POLLIN)

    def _close_upstream(self, peer: RelayedPeer) -> None:
        self._by_socket.pop(peer.upstream, None)
        self._poller.unregister(peer.upstream)
        peer.upstream.close(linger=0)
        peer.upstream = None

    def _drop(self, peer: RelayedPeer) -> None:
        self.peers.pop(peer.identity, None)
        if peer.upstream is not None:
            self._close_upstream(peer)

    def _expire(self) -> None:
        now = time.monotonic()
        for peer in [p for p in self.peers.values() if now - p.last_heard > self.peer_timeout_s]:
            self._drop(peer)

    def _up(self, peer: RelayedPeer, frames: list) -> None:
        try:
            peer.upstream.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:  # the learner's queue is full or it is gone: the actor's spool resends
            self.stats.reject("send_failed")
            return
        self.stats.messages_up += 1

    # -- learner -> actors -------------------------------------------------------------------------
    def _from_learner(self, peer: RelayedPeer, max_messages: int) -> None:
        for _ in range(max_messages):
            try:
                frames = peer.upstream.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                header = parse_header(frames, self.limits)
                kind = header.kind
                if kind == P.REFUSED and "ingest_port" in header.fields and peer.hello is not None:
                    # the learner ingests this actor on another port of its host: say HELLO there
                    self._dial(peer, P.ingest_endpoint(self.learner, P.field(header.fields, "ingest_port", int)))
                    self._up(peer, peer.hello)
                    return
            except MessageError as err:
                self.stats.reject(err.reason)
                continue
            if kind == P.WEIGHTS:  # not for a relayed session: the learner is older than relays
                self.stats.reject("weights_from_learner")
                continue
            self._down_send([peer.identity, *frames])
            if kind == P.WELCOME:
                peer.welcomed = True
                self._maybe_send_weights(peer)
            elif kind == P.REFUSED:
                peer.welcomed = False

    def _maybe_send_weights(self, peer: RelayedPeer) -> None:
        if not peer.welcomed:
            return
        update = peer.follower.next_update(self.publisher, self.weights_resend_s)
        if update is not None and self._down_send([peer.identity, *update.frames]):
            self.stats.weights_sent += 1
            self.stats.weights_bytes_sent += update.nbytes

    def _down_send(self, frames: list) -> bool:
        try:
            self._down.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # the actor's connection is gone (ROUTER_MANDATORY) or its queue full
            self.stats.reject("peer_gone")
            return False
        self.stats.messages_down += 1
        return True

    def metrics(self) -> dict:
        s = self.stats
        return {"actors": len(self.peers), "weights_received": s.weights_received, "weights_sent": s.weights_sent,
                "weights_bytes_sent": s.weights_bytes_sent, "messages_up": s.messages_up,
                "messages_down": s.messages_down, "rejected_by_reason": dict(s.rejected),
                "held": list(self.link.held_version), "learner_connected": self.link.connected}
