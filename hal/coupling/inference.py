"""A nearby inference process for coupled models: one policy answering many ranks.

Where a rank should not run the policy itself (a big network, a node with
an accelerator next to the model's nodes), ranks send their columns here
and get corrections back. One request per exchange, over a DEALER (rank)
to ROUTER (this process) pair, in the repository's codec::

    rank -> server   INFER(rank, seq)            arrays: profile [columns, levels, features] float32,
                                                         context [columns, context] float32 (if any)
    server -> rank   CORRECTION(seq, version)    arrays: correction [columns, levels] float32

The client waits for its own ``seq`` with a deadline and discards late
answers, so a dead or slow server costs the model one deadline and a zero
correction, never a hang. The server follows the learner's weights through
a :class:`~.wire.client.LearnerLink` that declares no devices.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import zmq

from ..runtime import NumpyPolicy
from ..steps import NO_POLICY, PolicyVersion
from ..wire.client import LearnerLink, LinkError
from ..wire.codec import Limits, MessageError, decode, decode_arrays, encode, parse_header

INFER = "INFER"
CORRECTION = "CORRECTION"


class InferenceServer:
    """Answers INFER requests with ``policy``'s deterministic per-level corrections."""

    def __init__(self, policy: NumpyPolicy, radius: int, bind: str = "tcp://127.0.0.1:*",
                 learner: str | None = None, explore: bool = False, max_request_bytes: int = 64 << 20):
        """``max_request_bytes``: the largest request (a rank's columns) read; the socket drops larger."""
        from .link import level_inputs

        self._level_inputs = level_inputs
        self.policy = policy
        self.radius = radius
        self.explore = explore
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, max_request_bytes)
        self._socket.bind(bind)
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.limits = Limits(max_arrays=2, max_frame_bytes=max_request_bytes, max_message_bytes=max_request_bytes)
        self.answered = 0
        self.rejected = 0
        self._link = None
        if learner is not None:
            self._link = LearnerLink(learner, actor_name="inference", actor_id=-1, devices=[])
            with contextlib.suppress(LinkError):
                self._link.connect()

    def serve(self, duration_s: float) -> None:
        """Answer requests for ``duration_s`` seconds."""
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            self.serve_once(timeout_ms=50)

    def serve_once(self, timeout_ms: int = 0) -> None:
        if self._link is not None:
            with contextlib.suppress(LinkError):  # the learner never answered: keep the weights we have
                self._link.poll(0)
            weights = self._link.take_weights()
            if weights is not None:
                self.policy.load_weights(*weights)
        if not self._socket.poll(timeout_ms, zmq.POLLIN):
            return
        while True:
            try:
                identity, *frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                header = parse_header(frames, self.limits)
                if header.kind != INFER:  # decided before any array is read
                    raise MessageError("kind", f"expected INFER, got {header.kind!r}")
                msg = decode_arrays(header, frames)
                if "profile" not in msg.arrays:
                    raise MessageError("kind", "INFER without a profile")
                profile = np.asarray(msg.arrays["profile"], np.float32)
                context = msg.arrays.get("context")
                windows = self._level_inputs(profile, None if context is None else np.asarray(context, np.float32),
                                             self.radius)
                action, _ = self.policy.act({"window": windows}, explore=self.explore)
            except (MessageError, KeyError, ValueError):
                self.rejected += 1
                continue
            reply = encode(CORRECTION, {"seq": msg.fields.get("seq", 0), "version": list(self.policy.version)},
                           {"correction": np.ascontiguousarray(action[..., 0], np.float32)})
            self._socket.send_multipart([identity, *reply], copy=False)
            self.answered += 1

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
        self._socket.close(linger=0)


class InferenceClient:
    """A rank's side: one request in flight, answered within ``timeout_s`` or not at all."""

    def __init__(self, endpoint: str, rank: int, timeout_s: float):
        self.rank = rank
        self.timeout_s = timeout_s
        self.version: PolicyVersion = NO_POLICY
        self._seq = 0
        self._socket = zmq.Context.instance().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 4)
        self._socket.connect(endpoint)

    def infer(self, profile: np.ndarray, context: np.ndarray | None) -> np.ndarray | None:
        self._seq += 1
        arrays = {"profile": profile}
        if context is not None:
            arrays["context"] = context
        try:
            self._socket.send_multipart(encode(INFER, {"rank": self.rank, "seq": self._seq}, arrays),
                                        zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        deadline = time.monotonic() + self.timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            if not self._socket.poll(int(remaining * 1000) + 1, zmq.POLLIN):
                continue
            try:
                msg = decode(self._socket.recv_multipart(copy=False))
            except MessageError:
                continue
            if msg.kind != CORRECTION or msg.fields.get("seq") != self._seq:
                continue  # a late answer to an earlier request
            correction = np.asarray(msg.arrays.get("correction"))
            if correction.shape != profile.shape[:2]:
                return None
            self.version = PolicyVersion(*msg.fields.get("version", NO_POLICY))
            return correction
        return None

    def close(self) -> None:
        self._socket.close(linger=0)
