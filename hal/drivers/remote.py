"""A robot on another machine, driven as a normal device over ZeroMQ.

``RemoteDevice(endpoint)`` talks to a :class:`~embodyrl.hal.robot_server.RobotServer`
running on the robot's controller box (their conversation is
:mod:`embodyrl.hal.wire.robot`). The specs come from the server in the
``connect()`` handshake. Every request has a
deadline (``timeout_s`` per attempt) and is retried up to ``retries`` times
under the same sequence number, which the server answers from its cache, so
a lost reply neither wedges the socket (DEALER, not REQ) nor steps the robot
twice. When every attempt fails the call raises :class:`RemoteTimeout`; by
then the server's watchdog has stopped the robot on its own.

``connect()`` never waits in silence: while it waits for the server's SPECS it reads the
socket's monitor (:class:`~embodyrl.hal.wire.security.HandshakeWatch`) and raises
:class:`RemoteError` (``handshake``) at once when ZeroMQ makes the cause certain (our key not
authorised there, the wrong server key, keys on one side only); otherwise it says, once, after
``hint_after_s``, what is likely wrong, and keeps trying until its last attempt's deadline. No
send blocks: a socket the server shut out loses the attempt, which then times out.

Off this machine the link takes CurveZMQ keys (``keys=ClientKeys(own secret
key, the server's public key)``, made with ``embodyrl keys DIR NAME``); plain
TCP to a non-loopback address is refused unless ``allow_insecure``. With
keys the server binds the session to this actor's key: a restarted actor
with the same key resumes it, and no other key can take it over.

E-stops latch on the server with who set them: :meth:`RemoteDevice.clear_estop`
is the session owner's CLEAR, which lifts the owner's own and the watchdog's
latch and raises :class:`RemoteError` (``estop_by_admin``, ...) when an
admin's remains. A RESET or STEP the server refuses as ``estopped`` (a latch
set by an admin, or before this actor reconnected) makes the device
:attr:`~RemoteDevice.estopped` too (:attr:`~RemoteDevice.server_estop`, the
server's reason), so an actor loop under the console holds it and shows it
e-stopped until a CLEAR, RESET or STEP succeeds. :func:`admin_request` is an
admin key's ESTOP or CLEAR from outside the session (what a console given an
admin key sends).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import numpy as np
import zmq

from ..device import Device, EpisodeInterrupted, EStopError, Health, HoldInPlace
from ..specs import SpecError
from ..wire import robot as R
from ..wire.codec import DEFAULT_LIMITS, Limits, Message, decode, encode
from ..wire.security import (
    HANDSHAKE_EVENTS,
    HINT_AFTER_S,
    ClientKeys,
    HandshakeWatch,
    check_endpoint,
    secure_client,
)


class RemoteError(RuntimeError):
    """The robot server refused a request; ``reason`` is its short tag."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class RemoteTimeout(RemoteError):
    """No reply within every attempt's deadline."""


class WatchdogStopped(RemoteError, EpisodeInterrupted):
    """The server's watchdog stopped the robot (no command within its period): the episode is over,
    ``reset()`` continues. The actor loop starts a new episode instead of failing."""


class RemoteDevice(Device):
    """The actor's side of a remote robot."""

    def __init__(self, endpoint: str, *, timeout_s: float = 0.5, retries: int = 3, backoff: float = 2.0,
                 limits: Limits = DEFAULT_LIMITS, keys: ClientKeys | None = None, allow_insecure: bool = False,
                 context: zmq.Context | None = None, hint_after_s: float = HINT_AFTER_S,
                 on_hint: Callable[[str], None] | None = None):
        """``timeout_s``: deadline of the first attempt; each retry (same seq) waits
        ``backoff`` times longer than the one before, so a slow link is not flooded.
        ``keys``: this actor's CurveZMQ keys (needed off loopback unless ``allow_insecure``).
        ``on_hint(line)``: how ``connect()`` says what is likely wrong after ``hint_after_s`` without
        an answer (default: a line on stderr)."""
        super().__init__()
        if not timeout_s > 0 or retries < 0 or backoff < 1:
            raise ValueError(f"need timeout_s > 0, retries >= 0, backoff >= 1; got {timeout_s}, {retries}, {backoff}")
        check_endpoint(endpoint, keys is not None, allow_insecure)
        self.keys = keys
        self.backoff = backoff
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.retries = retries
        self.limits = limits
        self.hint_after_s = hint_after_s
        self.on_hint = on_hint
        self._context = context or zmq.Context.instance()
        self._socket: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None  # while connecting: why no answer comes
        self._watch: HandshakeWatch | None = None
        self._seq = 0
        self._last_health = Health()
        self.server_estop: str | None = None
        """The server's e-stop as its last refusal (``estopped``) named it, until a CLEAR, RESET or STEP
        succeeds: :attr:`estopped` while set, but it does not stop requests here (the server refuses
        them while it holds a latch, and one lifted from elsewhere lets them through)."""
        self.watchdog_s: float | None = None
        self._last: dict[str, np.ndarray] | None = None
        self._hold: HoldInPlace | None = None
        self.attempts_retried = 0
        """Attempts that timed out and were sent again (lost or late replies)."""
        self.stale_replies = 0
        """Replies to an earlier seq (a late answer to a retried request), discarded."""

    # -- lifecycle -------------------------------------------------------
    def _connect(self) -> None:
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.linger = 0
        if self.keys is not None:
            secure_client(self._socket, self.keys)
        self._monitor = self._socket.get_monitor_socket(HANDSHAKE_EVENTS)
        self._watch = HandshakeWatch(self.endpoint, self.keys, self._waited(1 + self.retries),
                                     hint_after_s=self.hint_after_s, say=self.on_hint, server="the robot server")
        self._socket.connect(self.endpoint)
        try:
            reply = self._request(R.HELLO, expect=R.SPECS)
            (self.observation_spec, self.action_spec, self.control_period_s,
             self.watchdog_s) = R.read_specs(reply.fields)
            self.holds_in_place = reply.fields.get("holds") is True
            self._hold = HoldInPlace(self.action_spec, self.observation_spec) if self.holds_in_place else None
        except (KeyError, TypeError, ValueError) as err:
            self._drop_socket()
            raise RemoteError("handshake", f"{self.endpoint} sent malformed specs: {err!r}") from err
        except BaseException:
            self._drop_socket()
            raise
        finally:
            self._unwatch()

    def _unwatch(self) -> None:
        if self._monitor is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = self._watch = None

    def _close(self) -> None:
        try:
            self._request(R.BYE, attempts=1)
        except RemoteError:
            pass  # the server releases a silent session after its watchdog period anyway
        finally:
            self._drop_socket()

    def _drop_socket(self) -> None:
        if self._socket is not None:
            self._unwatch()
            self._socket.close()
            self._socket = None

    # -- control ---------------------------------------------------------
    def _reset(self, seed: int | None) -> dict[str, np.ndarray]:
        fields = {"seed": None if seed is None else int(seed)}
        try:
            return self._observation(self._request(R.RESET, fields))
        except RemoteError as err:
            if err.reason != R.NO_SESSION:
                raise
        self._request(R.HELLO, expect=R.SPECS)  # the link was down past the watchdog: rejoin
        return self._observation(self._request(R.RESET, fields))

    def _step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        return self._observation(self._request(R.STEP, arrays={"action": action}))

    def _on_estop(self) -> None:
        if self._socket is not None:
            try:
                # two quick tries: the caller is stopping; the server's watchdog is the backstop
                self._request(R.ESTOP, {"reason": self._estop_reason or "e-stop"}, attempts=min(2, 1 + self.retries))
            except RemoteError:
                self._last_health = Health("faulted", "e-stop not confirmed by the robot server")

    @property
    def estopped(self) -> bool:
        return self._estop_reason is not None or self.server_estop is not None

    def clear_estop(self) -> None:
        """Clear the e-stop here and on the server (which latches its own)."""
        if self._socket is not None:
            self._request(R.CLEAR)
            self.server_estop = None
        super().clear_estop()

    def _health(self) -> Health:
        if self.server_estop is not None:
            return Health("faulted", f"e-stop: {self.server_estop}")
        return self._last_health

    def server_status(self) -> dict:
        """The server's counters (requests, replays, watchdog trips, ...)."""
        return dict(self._request(R.STATUS).fields)

    def _observation(self, reply: Message) -> dict[str, np.ndarray]:
        self.server_estop = None  # the server took a RESET or STEP: it holds no e-stop
        self._last_health = Health(reply.fields.get("health", "ok"), reply.fields.get("reason", ""))
        self._last = dict(reply.arrays)
        return self._last

    def hold_action(self) -> np.ndarray | None:
        """Where the robot server says its safe action holds the robot in place: the action holding it
        at its last observed state (None before any)."""
        if not self.holds_in_place or self._last is None:
            return None
        return self._hold(self._last)

    # -- request / reply -------------------------------------------------
    def _request(self, kind: str, fields: dict | None = None, arrays: dict | None = None,
                 expect: str | None = None, attempts: int | None = None) -> Message:
        if self._socket is None:
            raise RuntimeError(f"{type(self).__name__} is not connected: call connect() first")
        self._seq += 1
        seq = self._seq
        frames = encode(kind, {**(fields or {}), "seq": seq}, arrays)
        attempts = 1 + self.retries if attempts is None else attempts
        for attempt in range(attempts):
            if attempt:
                self.attempts_retried += 1
            with contextlib.suppress(zmq.Again):  # no connection to queue it on (the server shut us out)
                self._socket.send_multipart(frames, zmq.NOBLOCK)  # the attempt then times out
            reply = self._await(seq, self.timeout_s * self.backoff**attempt)
            if reply is not None:
                return self._check(kind, reply, expect)
        self._last_health = Health("degraded", f"{kind}: no reply from {self.endpoint}")
        if self._watch is not None:
            hint = f": {self._watch.causes()}"
        else:
            hint = " (is this actor's key authorised there?)" if self.keys is not None else ""
        raise RemoteTimeout("timeout", f"{kind} seq {seq}: no reply from {self.endpoint} "
                                       f"in {attempts} attempts ({self._waited(attempts):.3g} s){hint}")

    def _waited(self, attempts: int) -> float:
        """How long ``attempts`` attempts wait in all."""
        return sum(self.timeout_s * self.backoff**a for a in range(attempts))

    def _ready(self, timeout_s: float) -> bool:
        """Whether a reply arrived within ``timeout_s``. While connecting, the monitor is read too: a
        certain cause raises ``handshake`` at once, and silence past ``hint_after_s`` is said once."""
        if self._watch is None:
            return bool(self._socket.poll(timeout_s * 1000))
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            readable = self._socket.poll(max(min(left, 0.05), 0) * 1000)  # 20 Hz: the monitor is read between
            self._watch.read(self._monitor)
            if self._watch.failure is not None:
                raise RemoteError("handshake", f"{self.endpoint}: {self._watch.failure}")
            if readable:
                return True
            self._watch.waiting()
            if left <= 0:
                return False

    def _await(self, seq: int, timeout_s: float) -> Message | None:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self._ready(left):
                return None
            reply = decode(self._socket.recv_multipart(copy=False), self.limits)
            if reply.fields.get("seq") == seq:
                return reply
            self.stale_replies += 1
        return None

    def _check(self, kind: str, reply: Message, expect: str | None) -> Message:
        if reply.kind == R.ERROR:
            reason, detail = str(reply.fields.get("reason")), str(reply.fields.get("detail"))
            if reason == R.ESTOPPED:
                self.server_estop = f"robot server: {detail}"
                raise EStopError(self.server_estop)
            if reason in (R.BAD_ACTION, R.OUT_OF_BOUNDS):
                raise SpecError(f"robot server refused the action ({reason}): {detail}")
            error = WatchdogStopped if reason == R.WATCHDOG_TRIPPED else RemoteError
            raise error(reason, f"{kind} refused by {self.endpoint}: {detail}")
        if reply.kind == R.REFUSED:
            raise RemoteError("refused", f"{self.endpoint}: {reply.fields.get('reason')}")
        wanted = expect or (R.OBS if kind in (R.RESET, R.STEP) else R.OK)
        if reply.kind != wanted:
            raise RemoteError("protocol", f"{kind}: expected {wanted}, got {reply.kind}")
        return reply


def admin_request(endpoint: str, keys: ClientKeys, kind: str, *, reason: str = "admin e-stop",
                  release: bool = False, timeout_s: float = 1.0, retries: int = 2,
                  context: zmq.Context | None = None) -> dict:
    """An admin key's ESTOP or CLEAR to a robot server, sent from outside the actor's session.

    ``keys``: the admin's own secret key and the server's public key (the admin's public key must be
    in the server's ``--admin-keys``). ESTOP latches an admin e-stop (``reason``) and commands the
    safe action; CLEAR lifts every latch software may lift and, with ``release``, also releases the
    session (the default here is to leave the actor its session). Both are idempotent, so a lost
    reply is simply sent again. Returns the reply's fields (``released``); raises
    :class:`RemoteError` on a refusal (``driver_hung``; ``no_session`` for a key that is no admin's)
    and :class:`RemoteTimeout` when no reply comes.
    """
    if kind not in (R.ESTOP, R.CLEAR):
        raise ValueError(f"an admin sends ESTOP or CLEAR, not {kind!r}")
    socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
    socket.linger = 0
    try:
        secure_client(socket, keys)
        socket.connect(endpoint)
        fields = {"seq": 1, "reason": reason} if kind == R.ESTOP else {"seq": 1, "release": bool(release)}
        for attempt in range(1 + retries):
            with contextlib.suppress(zmq.Again):  # shut out (a key the server does not know): times out
                socket.send_multipart(encode(kind, fields), zmq.NOBLOCK)
            if socket.poll(timeout_s * 1000 * 2**attempt):
                reply = decode(socket.recv_multipart(copy=False))
                if reply.kind == R.ERROR:
                    raise RemoteError(str(reply.fields.get("reason")), f"{kind} refused by {endpoint}: "
                                                                       f"{reply.fields.get('detail')}")
                if reply.kind != R.OK:
                    raise RemoteError("protocol", f"{kind}: expected OK, got {reply.kind}")
                return dict(reply.fields)
    finally:
        socket.close()
    raise RemoteTimeout("timeout", f"admin {kind}: no reply from {endpoint} in {1 + retries} attempts "
                                   "(is this key in the server's --admin-keys?)")
