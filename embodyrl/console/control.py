"""The console's control endpoint: a ROUTER that actors and the learner dial, and the actions sent
through it.

Everything here runs in the console's event loop (``zmq.asyncio``): no
thread shares the state. A message is parsed within :data:`control.LIMITS`
before anything is decoded; from a peer that has not said HELLO only a HELLO
is read, within the tighter :data:`control.HELLO_LIMITS`, and anything else
dropped (it says HELLO again within two seconds). A HELLO's role and id are
bound to the connection, and with keys to its key (:mod:`.identity`); a
refused claimant is told why, naming the holder. An action goes to each
peer it targets (the one that holds the id) as a COMMAND and waits for its
DONE from that same connection; a peer that is not connected, or that does
not answer within :data:`ANSWER_TIMEOUT_S`, makes it fail with a reason the
page shows. Given an admin key (:mod:`.admin`), an ``estop`` or
``clear_estop`` also goes to the robot servers the operator named for the
devices it targets, never to one a peer names.
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
from ..hal.wire.robot import CLEAR, ESTOP
from ..hal.wire.security import ServerKeys, ServerSocket, peer_key
from ..runlog import CONSOLE
from .admin import ADMIN_ACTIONS, NEEDS_ADMIN_KEY, AdminKey
from .identity import Claims, Refused, connection_name
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
    """Binds the control endpoint, keeps :class:`ConsoleState` current, and sends actions.
    ``bindings_path``: with keys, where each key's actor id is kept across restarts; ``admin``:
    the admin key and the robot servers it reaches (:mod:`.admin`)."""

    def __init__(self, state: ConsoleState, endpoint: str, keys: ServerKeys | None = None,
                 log: ActionLog | None = None, bindings_path: Path | None = None, admin: AdminKey | None = None):
        self.state, self.log, self.admin = state, log, admin
        if admin is not None:
            state.admin_robots = admin.view()
        self.claims = Claims(keys.authorized_dir if keys is not None else None, bindings_path)
        self._server = ServerSocket(endpoint, keys, asyncio=True, options={
            zmq.ROUTER_MANDATORY: 1,  # an unknown peer is an error, not a silent drop
            zmq.MAXMSGSIZE: control.LIMITS.max_message_bytes + control.LIMITS.max_header_bytes,
            zmq.SNDHWM: 256})
        self.socket, self.endpoint = self._server.socket, self._server.endpoint
        self._ids = itertools.count(1)
        self._pending: dict[tuple[bytes, str], asyncio.Future] = {}  # (peer's connection, command id)
        self.refused = 0
        """Malformed messages."""
        self.claims_refused = 0
        self.stray_answers = 0
        """DONEs that answer no command sent to their connection (forged, or too late)."""

    async def run(self) -> None:
        """Receive until cancelled."""
        while True:
            frames = await self.socket.recv_multipart(copy=False)
            try:
                self._receive(frames[0].bytes, frames[1:])
            except Exception as err:  # noqa: BLE001 - one peer's message never stops the endpoint
                self.refused += 1
                warnings.warn(f"console: a message failed ({type(err).__name__}: {err})", stacklevel=2)

    def close(self) -> None:
        self._server.close()
        if self.admin is not None:
            self.admin.close()

    # -- what peers send ---------------------------------------------------------
    def _receive(self, identity: bytes, frames: list) -> None:
        peer = self.state.peer(identity)
        try:
            if peer is None:
                self._sessionless(identity, frames)
                return
            header = parse_header(frames, control.LIMITS)
            if header.kind not in control.KINDS:
                raise MessageError("kind", f"unknown kind {header.kind!r}")
            if header.kind == control.HELLO:
                self._hello(identity, header.fields, frames[0])
            else:
                self._from(peer, header, frames)
        except MessageError as err:
            self.refused += 1
            if self.refused <= 10 or self.refused % 1000 == 0:
                warnings.warn(f"console: refused a message ({err})", stacklevel=2)

    def _sessionless(self, identity: bytes, frames: list) -> None:
        """A peer without a session: only a HELLO is read (it says one again within two seconds),
        and one too large to show is refused undecoded."""
        try:
            header = parse_header(frames, control.HELLO_LIMITS)
        except MessageError as err:
            self.refused += 1
            if err.reason == "header_size":
                self._send(identity, encode(control.REFUSED, {
                    "reason": f"HELLO refused: {err.detail} (its devices are too many to show)", "retry": False}))
            return
        if header.kind == control.HELLO:
            self._hello(identity, header.fields, frames[0])

    def _hello(self, identity: bytes, fields: dict, frame) -> None:
        try:
            role, actor_id, devices = control.hello(fields)
        except MessageError as err:
            self._send(identity, encode(control.REFUSED, {"reason": str(err), "retry": False}))
            raise
        try:
            known = self.state.peer(identity)
            if known is not None and (known.role, known.actor_id) != (role, actor_id):
                raise Refused(f"this connection speaks as {known.name()}; another id needs a connection of its own")
            key = peer_key(frame)
            self.claims.check(self.state.holder(role, actor_id), identity, key, role, actor_id)
            name = self.claims.key_name(key)
            who = f"key {name!r}" if name is not None else connection_name(identity, _address(frame))
            self.state.hello(identity, role, actor_id, devices, who)
        except Refused as refusal:
            self.claims_refused += 1
            retry = refusal.retry_after_s
            self._send(identity, encode(control.REFUSED, {
                "reason": refusal.reason, "retry": retry is not None,
                "retry_after_s": round(retry, 3) if retry is not None else None}))
            return
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
            width, height = fields.get("width"), fields.get("height")
            self.state.frame(peer, device, name, seq, jpeg.tobytes(), width if control.is_id(width) else 0,
                             height if control.is_id(height) else 0)
        elif header.kind == control.DONE:
            ident = fields.get("id")
            future = self._pending.pop((peer.identity, ident), None) if isinstance(ident, str) else None
            if future is None or future.done():
                self.stray_answers += 1
                return
            future.set_result((bool(fields.get("ok")), str(fields.get("error") or "")[:500], fields.get("at")))

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
        if actor is not None and not control.is_id(actor):
            raise BadAction(f"actor must be an integer in [0, {control.MAX_ID}] or null, not {actor!r}")
        try:
            control.command({"id": "check", "action": action, "device": device, "value": value})
        except MessageError as err:
            raise BadAction(err.detail) from None
        if action == "stream":  # the checked settings, not whatever else the request's map held
            value = control.stream_settings(value).fields()
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
        robots = self.admin.targets(actor, device) if self.admin is not None and action in ADMIN_ACTIONS else []
        commands = [self._command(name, peer, Command(f"{entry.id}.{i}", action, None if learner_action else device,
                                                      value), entry.received) for i, (name, peer) in enumerate(peers)]
        if action == "estop":  # the robot servers at once, beside the actors: the admin's latch needs no actor
            admin = [self.admin.send(robot, ESTOP, entry.received, f"operator console e-stop ({origin or 'api'})")
                     for robot in robots]
            entry.results = list(await asyncio.gather(*admin, *commands))
        else:  # the admin's CLEAR first: the actor's own CLEAR and reset then find nothing it may not lift
            entry.results = list(await asyncio.gather(*(self.admin.send(robot, CLEAR, entry.received)
                                                        for robot in robots)))
            entry.results += await asyncio.gather(*commands)
        if action == "clear_estop":
            for result, (_, peer) in zip(entry.results[len(robots):], peers, strict=True):
                covered = self.admin is not None and peer is not None and self.admin.targets(peer.actor_id, device)
                if "estop_by_admin" in result["error"] and peer is not None and not covered:
                    hint = NEEDS_ADMIN_KEY.format(actor=peer.actor_id, device="DEVICE" if device is None else device)
                    result["error"] = f"{result['error']}; {hint}"
        if not entry.results:
            entry.results = [{"target": target, "ok": False, "error": "no actor has connected", "ms": None}]
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
        key = (peer.identity, command.id)
        self._pending[key] = future
        if not self._send(peer.identity, encode(control.COMMAND, command.fields())):
            self._pending.pop(key, None)
            result["error"] = f"{name} cannot be reached"
            return result
        try:
            ok, error, at = await asyncio.wait_for(future, ANSWER_TIMEOUT_S)
        except TimeoutError:
            self._pending.pop(key, None)
            result["error"] = f"no answer from {name} within {ANSWER_TIMEOUT_S:g} s"
            return result
        result.update(ok=ok, error=error, ms=round((time.monotonic() - received) * 1000, 2))
        if isinstance(at, (int, float)):  # the peer's monotonic clock: comparable on one machine only
            result["applied_ms"] = round((at - received) * 1000, 2)
        return result


def _address(frame) -> str | None:
    """The peer's IP address, as ZeroMQ saw the connection (None where it cannot say)."""
    try:
        return frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):
        return None
