"""The console's control endpoint: a ROUTER that actors and the learner dial, and the actions sent
through it.

Everything here runs in the console's event loop (``zmq.asyncio``): no
thread shares the state. A message is parsed within :data:`control.LIMITS`
before anything is decoded; one from a peer that has not said HELLO is
dropped (it says HELLO again within two seconds). An action goes to each
peer it targets as a COMMAND and waits for its DONE; a peer that is not
connected, or that does not answer within :data:`ANSWER_TIMEOUT_S`, makes it
fail with a reason the page shows.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
import warnings
from pathlib import Path

import zmq

from ..hal.wire import control
from ..hal.wire.codec import MessageError, decode_arrays, encode, parse_header
from ..hal.wire.control import Command
from ..hal.wire.security import ServerKeys, ServerSocket
from ..runlog import CONSOLE
from .state import Action, ConsoleState, Peer

ANSWER_TIMEOUT_S = 2.0


class BadAction(ValueError):
    """An action request that names no known action, or a bad target or value."""


class ActionLog:
    """Each action, and the console's curve points, as lines of the run's ``metrics.jsonl``
    (one ``write`` of one line, appended: the learner appends its own records to the same file)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.jsonl"

    def write(self, row: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(row) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as err:  # a full disk costs the log line, never the action
            warnings.warn(f"console: could not log to {self.path}: {err}", stacklevel=2)


class ControlServer:
    """Binds the control endpoint, keeps :class:`ConsoleState` current, and sends actions."""

    def __init__(self, state: ConsoleState, endpoint: str, keys: ServerKeys | None = None,
                 log: ActionLog | None = None):
        self.state, self.log = state, log
        self._server = ServerSocket(endpoint, keys, asyncio=True, options={
            zmq.ROUTER_MANDATORY: 1,  # an unknown peer is an error, not a silent drop
            zmq.MAXMSGSIZE: control.LIMITS.max_message_bytes + control.LIMITS.max_header_bytes,
            zmq.SNDHWM: 256})
        self.socket, self.endpoint = self._server.socket, self._server.endpoint
        self._ids = itertools.count(1)
        self._pending: dict[str, asyncio.Future] = {}
        self.refused = 0

    async def run(self) -> None:
        """Receive until cancelled."""
        while True:
            frames = await self.socket.recv_multipart(copy=False)
            self._receive(frames[0].bytes, frames[1:])

    def close(self) -> None:
        self._server.close()

    # -- what peers send ---------------------------------------------------------
    def _receive(self, identity: bytes, frames: list) -> None:
        try:
            header = parse_header(frames, control.LIMITS)
            if header.kind not in control.KINDS:
                raise MessageError("kind", f"unknown kind {header.kind!r}")
            peer = self.state.peer(identity)
            if header.kind == control.HELLO:
                self._hello(identity, header.fields)
                return
            if peer is None:  # no session: dropped unread; it says HELLO again soon
                return
            self._from(peer, header, frames)
        except MessageError as err:
            self.refused += 1
            if self.refused <= 10 or self.refused % 1000 == 0:
                warnings.warn(f"console: refused a message ({err})", stacklevel=2)

    def _hello(self, identity: bytes, fields: dict) -> None:
        try:
            role, actor_id, devices = control.hello(fields)
        except MessageError as err:
            self._send(identity, encode(control.REFUSED, {"reason": str(err)}))
            raise
        self.state.hello(identity, role, actor_id, devices)
        self._send(identity, encode(control.WELCOME, {"protocol": control.CONTROL_PROTOCOL}))

    def _from(self, peer: Peer, header, frames: list) -> None:
        fields = header.fields
        if header.kind == control.STATUS:
            status = fields.get("status")
            self.state.status(peer, status if isinstance(status, dict) else {})
        elif header.kind == control.METRICS and peer.role == "learner":
            record = fields.get("record")
            row = self.state.metrics(peer, record if isinstance(record, dict) else {})
            if row is not None and self.log is not None:
                self.log.write(row)
        elif header.kind == control.FRAME and peer.role == "actor":
            message = decode_arrays(header, frames)
            jpeg = message.arrays.get("jpeg")
            device, name, seq = fields.get("device"), fields.get("field"), fields.get("seq")
            if (jpeg is None or type(device) is not int or not isinstance(name, str) or type(seq) is not int
                    or not any(d["device_id"] == device and name in d["cameras"] for d in peer.devices)):
                raise MessageError("field_type", f"{peer.name()}: a frame of no declared camera")
            self.state.frame(peer, device, name, seq, jpeg.tobytes(),
                             int(fields.get("width") or 0), int(fields.get("height") or 0))
        elif header.kind == control.DONE:
            ident = fields.get("id")
            future = self._pending.pop(ident, None) if isinstance(ident, str) else None
            if future is not None and not future.done():
                future.set_result((bool(fields.get("ok")), str(fields.get("error") or ""), fields.get("at")))

    def _send(self, identity: bytes, frames: list) -> bool:
        try:
            self.socket.send_multipart([identity, *frames], flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.ZMQError:  # EHOSTUNREACH (gone) or EAGAIN (not reading)
            return False

    # -- actions -------------------------------------------------------------------
    async def act(self, action: str, actor: int | None = None, device: int | None = None, value=None,
                  origin: str = "") -> Action:
        """Send ``action`` to its peers and wait for their answers; the logged :class:`Action`."""
        if actor is not None and (type(actor) is not int or actor < 0):
            raise BadAction(f"actor must be a non-negative integer or null, not {actor!r}")
        try:
            control.command({"id": "check", "action": action, "device": device, "value": value})
        except MessageError as err:
            raise BadAction(err.detail) from None
        learner_action = action in control.LEARNER_ACTIONS
        if learner_action:
            target, peers = "the learner", [("the learner", self.state.learner)]
        elif actor is None:
            target = "all actors" if device is None else f"device {device} of every actor"
            peers = [(peer.name(), peer) for _, peer in sorted(self.state.actors.items())]
        else:
            target = f"actor {actor}" + ("" if device is None else f" device {device}")
            peers = [(f"actor {actor}", self.state.actors.get(actor))]
        entry = Action(f"a{next(self._ids)}", time.time(), origin, action, target)
        self.state.actions.append(entry)
        if not peers:
            entry.results = [{"target": target, "ok": False, "error": "no actor has connected", "ms": None}]
        else:
            entry.results = list(await asyncio.gather(*(
                self._command(name, peer, Command(f"{entry.id}.{i}", action, None if learner_action else device, value),
                              entry.received) for i, (name, peer) in enumerate(peers))))
        failed = [r for r in entry.results if not r["ok"]]
        entry.status = "failed" if failed else "ok"
        entry.error = "; ".join(f"{r['target']}: {r['error']}" for r in failed)
        done = [r["ms"] for r in entry.results if r["ms"] is not None]
        entry.ms = round(max(done), 2) if done else None
        if self.log is not None:
            self.log.write({"source": CONSOLE, "event": "action", **entry.entry()})
        return entry

    async def _command(self, name: str, peer: Peer | None, command: Command, received: float) -> dict:
        result = {"target": name + ("" if command.device_id is None else f" device {command.device_id}"),
                  "ok": False, "error": "", "ms": None, "applied_ms": None}
        if peer is None:
            result["error"] = f"{name} has never connected"
            return result
        if not peer.connected:
            result["error"] = f"{name} is not connected (last heard {time.monotonic() - peer.last_seen:.1f} s ago)"
            return result
        future = asyncio.get_running_loop().create_future()
        self._pending[command.id] = future
        if not self._send(peer.identity, encode(control.COMMAND, command.fields())):
            self._pending.pop(command.id, None)
            result["error"] = f"{name} cannot be reached"
            return result
        try:
            ok, error, at = await asyncio.wait_for(future, ANSWER_TIMEOUT_S)
        except TimeoutError:
            self._pending.pop(command.id, None)
            result["error"] = f"no answer from {name} within {ANSWER_TIMEOUT_S:g} s"
            return result
        result.update(ok=ok, error=error, ms=round((time.monotonic() - received) * 1000, 2))
        if isinstance(at, (int, float)):  # the peer's monotonic clock: comparable on one machine only
            result["applied_ms"] = round((at - received) * 1000, 2)
        return result
