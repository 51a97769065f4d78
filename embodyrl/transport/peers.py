"""Peer links between learners: rounds of parameter exchange with neighbours.

Distributed Q-learning reaches consensus by mixing each learner's estimate
with its neighbours' on a communication graph. Every learner binds one
ROUTER for incoming peer messages and dials a DEALER to each neighbour it
sends to. A message carries (sender, round, arrays); :meth:`PeerLink.exchange`
sends this round's arrays to the out-neighbours and waits, with a deadline,
for the in-neighbours' arrays of the same round. Messages of later rounds
are kept for later; stale or duplicated rounds are dropped and counted; a
neighbour that misses the deadline is reported missing, never waited on
forever. Same codec, limits and (optionally) CurveZMQ keys as the actor link.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import zmq

from ..hal.wire import protocol as P
from ..hal.wire.codec import (
    DEFAULT_LIMITS,
    Limits,
    MessageError,
    decode_arrays,
    encode,
    parse_header,
)

PEER = "PEER"


@dataclass
class PeerStats:
    messages_out: int = 0
    bytes_out: int = 0
    messages_in: int = 0
    bytes_in: int = 0
    stale: int = 0
    duplicates: int = 0
    missed: int = 0
    rejected: dict[str, int] = field(default_factory=dict)


class PeerLink:
    def __init__(self, peer_id: int, bind: str = "tcp://127.0.0.1:*", *,
                 limits: Limits = DEFAULT_LIMITS, context: zmq.Context | None = None):
        self.peer_id = peer_id
        self.limits = limits
        self._context = context or zmq.Context.instance()
        self._inbox = self._context.socket(zmq.ROUTER)
        self._inbox.setsockopt(zmq.LINGER, 0)
        self._inbox.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes + limits.max_header_bytes)
        self._inbox.bind(bind)
        self.endpoint: str = self._inbox.getsockopt_string(zmq.LAST_ENDPOINT)
        self._out: dict[int, zmq.Socket] = {}
        self._pending: dict[int, dict[int, dict[str, np.ndarray]]] = defaultdict(dict)  # round -> sender -> arrays
        self._round = -1
        self._expected: Limits | None = None
        """Once this learner has sent a round: the most a peer's round can be (its arrays, a margin)."""
        self.stats = PeerStats()

    def connect(self, neighbours: dict[int, str]) -> None:
        """Dial the out-neighbours: ``{peer id: endpoint}``."""
        for peer, endpoint in neighbours.items():
            if peer in self._out:
                continue
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 16)
            sock.connect(endpoint)
            self._out[peer] = sock

    def close(self) -> None:
        for sock in self._out.values():
            sock.close(0)
        self._out.clear()
        self._inbox.close(0)

    def exchange(self, round_: int, arrays: dict[str, np.ndarray], expect: set[int],
                 timeout_s: float = 10.0) -> dict[int, dict[str, np.ndarray]]:
        """Send ``arrays`` for ``round_`` to every out-neighbour; return what the
        peers in ``expect`` sent for the same round (those missing at the deadline are left out)."""
        if round_ <= self._round:
            raise ValueError(f"round {round_} is not after {self._round}")
        self._round = round_
        frames = encode(PEER, {"sender": self.peer_id, "round": round_}, arrays)
        size = sum(memoryview(f).nbytes for f in frames)
        if self._expected is None and arrays:  # every learner exchanges the same pytree: its size bounds theirs
            declared = sum(np.asarray(a).nbytes for a in arrays.values())
            self._expected = self.limits.within(len(arrays), int(1.25 * declared) + 4096)
        for sock in self._out.values():
            try:
                sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
                self.stats.messages_out += 1
                self.stats.bytes_out += size
            except zmq.Again:
                self.stats.rejected["send_queue_full"] = self.stats.rejected.get("send_queue_full", 0) + 1
        deadline = time.monotonic() + timeout_s
        while not expect <= set(self._pending.get(round_, {})):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._receive(int(min(remaining, 0.05) * 1000))
        got = self._pending.pop(round_, {})
        self.stats.missed += len(expect - set(got))
        for old in [r for r in self._pending if r < round_]:
            del self._pending[old]
        return {peer: arrays for peer, arrays in got.items() if peer in expect}

    def exchange_fn(self, timeout_s: float):
        """This link as the algorithms' :data:`~embodyrl.algos.consensus.Exchange`."""
        return lambda round_, arrays, expect: self.exchange(round_, arrays, expect, timeout_s)

    def traffic(self) -> dict[str, int]:
        """What was sent so far (the algorithms' :data:`~embodyrl.algos.consensus.Traffic`)."""
        return {"messages_out": self.stats.messages_out, "bytes_out": self.stats.bytes_out}

    def _receive(self, timeout_ms: int) -> None:
        if not self._inbox.poll(timeout_ms, zmq.POLLIN):
            return
        while True:
            try:
                frames = self._inbox.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.stats.messages_in += 1
            self.stats.bytes_in += sum(len(f) for f in frames[1:])
            try:  # the header decides first: stale and duplicate rounds are never decoded
                header = parse_header(frames[1:], self._expected or self.limits)
                if header.kind != PEER:
                    raise MessageError("kind", f"unexpected {header.kind!r} on a peer link")
                sender = P.field(header.fields, "sender", int)
                round_ = P.field(header.fields, "round", int)
                if round_ < self._round:
                    self.stats.stale += 1
                elif sender in self._pending.get(round_, {}):
                    self.stats.duplicates += 1
                else:
                    msg = decode_arrays(header, frames[1:])
                    self._pending[round_][sender] = {k: np.array(v) for k, v in msg.arrays.items()}
            except MessageError as err:
                self.stats.rejected[err.reason] = self.stats.rejected.get(err.reason, 0) + 1
