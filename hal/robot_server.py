"""The robot server: runs next to the hardware and drives it for one remote actor.

A robot's controller box runs this server around a :class:`RobotDriver` (the
small class a user writes against the vendor SDK); the actor drives it as a
normal device through :class:`~embodyrl.hal.drivers.remote.RemoteDevice`.

The conversation (ROUTER here, DEALER on the actor) is :mod:`.wire.robot`'s:
HELLO, RESET, STEP, ESTOP, CLEAR, STATUS and BYE, each with a ``seq`` that
its reply echoes.

An admin key (``admin_keys``) may send ESTOP and CLEAR from outside the
session (:func:`~.drivers.remote.admin_request`, what a console holding an
admin key calls): ``ESTOP {seq, reason}`` and ``CLEAR {seq, release=true}``
answer ``OK {seq, released}``; with ``release`` (the default) the CLEAR also
commands the safe action and releases the session, with ``release=false``
it only lifts the latches and the actor carries on.

Sequence numbers make retries idempotent: the server caches its last reply
and replays it for a repeated ``seq`` instead of stepping twice, and ignores
older ones, so an actor whose reply was lost simply sends the same request
again. Deadlines are the actor's: it waits ``timeout_s`` per attempt and
retries a bounded number of times.

What holds against any peer (docs/safety.md has the table):

* Actions are checked against the action spec's bounds here, next to the
  hardware: ``on_out_of_bounds="refuse"`` answers ERROR ``out_of_bounds`` and
  commands the safe action; ``"clip"`` clips. Both are counted.
* Three threads: the socket thread (this one: ``poll``/``serve``), the
  watchdog thread, and one driver thread (:class:`~.watchdog.DriverWorker`)
  that makes every driver call in order. Once the actor has stepped the
  robot, a gap of more than ``watchdog_s`` without a fresh command commands
  the safe action whatever arrives on the socket, and steps are refused
  until the actor resets.
* Every driver call has a deadline (:class:`DriverDeadlines`). One that
  overruns latches a ``driver_hung`` e-stop that software cannot clear.
* Each e-stop latch records who set it (an admin key by name, the session's
  owner, the watchdog, the driver) and only someone with that authority
  lifts it (:mod:`.estop`): the owner's CLEAR lifts its own and the
  watchdog's, never an admin's. STATUS lists them (``estops``).
* With CurveZMQ keys the session belongs to the actor's key: the same key
  may reconnect and resume; another key is refused until the owner says
  BYE or an admin key CLEARs. Without keys (loopback, or ``allow_insecure``)
  a session belongs to a ZeroMQ identity and is lost after ``watchdog_s`` of
  silence, so a restarted actor can take over.
* Requests from peers without a session are rate-limited before they are
  decoded (:class:`~.wire.security.RateLimiter`) and dropped unanswered over
  the limit; the session's own requests are not. The limits never lock out
  the session's own actor: with keys, the owner's key from a new connection
  spends only its own bucket; without keys, a restarted actor is a new
  connection like any flooder's, so a HELLO the shared bucket refuses may
  spend a small HELLO reserve that a flood of STATUS or junk never touches.
  Whether a message is a HELLO is read from its bytes before decoding (one
  small frame holding the header's ``"k": "HELLO"``); a message let in that
  way that turns out not to be a HELLO is dropped after its header parse.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path

import msgpack
import numpy as np
import zmq

from .device import Device, Health
from .estop import ADMIN, DRIVER, OWNER, WATCHDOG, Latches, refusal
from .specs import ArraySpec, DictSpec, SpecError
from .watchdog import DriverHung, DriverWorker
from .wire.codec import Limits, MessageError, decode, encode
from .wire.robot import (
    BAD_ACTION,
    BYE,
    CLEAR,
    ERROR,
    ESTOP,
    ESTOPPED,
    HELLO,
    NO_SESSION,
    OBS,
    OK,
    OUT_OF_BOUNDS,
    REFUSED,
    RESET,
    ROBOT_LIMITS,
    SPECS,
    STATUS,
    STEP,
    WATCHDOG_TRIPPED,
    specs_fields,
)
from .wire.security import (
    RateLimiter,
    RateLimits,
    SecurityError,
    SecurityOptionError,
    ServerKeys,
    ServerSocket,
    check_address,
    check_endpoint,
    peer_key,
    public_keys,
    server_keys,
)

log = logging.getLogger(__name__)

DEFAULT_RATE_LIMITS = RateLimits()
_HELLO_BYTES = msgpack.packb("k") + msgpack.packb(HELLO)
"""How a HELLO's header names its kind; looked for in small single-frame messages before decoding."""
_HELLO_MAX_BYTES = 128


class RobotDriver(abc.ABC):
    """What a user writes to put a real arm behind the server (see ``examples/``).

    The server calls, for each actor step: ``command(action)``, then (for a
    ``realtime`` robot) waits out ``control_period_s``, then
    ``read_observation()``. ``safe_action()`` is what the watchdog and the
    e-stop command. All methods run on the server's driver thread, one at a
    time, each against a deadline (:class:`DriverDeadlines`): the driver
    need not be thread-safe, and ``command`` should not block.
    """

    observation_spec: DictSpec
    action_spec: ArraySpec
    control_period_s: float
    realtime: bool = True
    """Whether the server waits out the control period between command and read."""
    holds_in_place: bool = False
    """Whether ``safe_action()`` holds the robot where it is (:class:`~.device.HoldInPlace`): the actor
    is told, so its own safe action between episodes holds too instead of commanding zeros."""

    def open(self) -> None:
        """Connect to the vendor SDK (default: nothing to do)."""

    def close(self) -> None:
        """Release the hardware (default: nothing to do)."""

    @abc.abstractmethod
    def reset(self, seed: int | None) -> dict[str, np.ndarray]:
        """Move to the start pose (blocking) and return the observation there."""

    @abc.abstractmethod
    def command(self, action: np.ndarray) -> None:
        """Send one action to the hardware (non-blocking on a real robot)."""

    @abc.abstractmethod
    def read_observation(self) -> dict[str, np.ndarray]:
        """The newest sensor readings, as the observation spec says."""

    def safe_action(self) -> np.ndarray | None:
        """The action that stops the robot (default: zeros, clipped into the bounds); None: nothing to
        command (a robot that holds in place before it was ever observed).

        The watchdog commands it once when it trips; hardware that needs a
        stream of commands to hold still must hold it in the driver or SDK.
        """
        return self.action_spec.clip(self.action_spec.zeros())

    def health(self) -> Health:
        return Health()


class DeviceDriver(RobotDriver):
    """Any HAL :class:`Device` (a simulator) as a robot driver: the simulated arm."""

    realtime = False  # simulated time advances with each command

    def __init__(self, device: Device, safe_action: np.ndarray | None = None):
        self.device = device
        self.observation_spec = device.observation_spec
        self.action_spec = device.action_spec
        self.control_period_s = device.control_period_s
        self._safe = None if safe_action is None else self.action_spec.validate(np.asarray(safe_action, self.action_spec.dtype))
        self._observation: dict[str, np.ndarray] | None = None
        self.holds_in_place = safe_action is None and device.holds_in_place

    def open(self) -> None:
        self.device.connect()

    def close(self) -> None:
        self.device.close()

    def reset(self, seed):
        self._observation = self.device.reset(seed)
        return self._observation

    def command(self, action):
        self._observation = self.device.step(action)

    def read_observation(self):
        if self._observation is None:
            raise RuntimeError("read_observation before reset")
        return self._observation

    def safe_action(self):
        if self._safe is not None:
            return self._safe
        return self.device.hold_action() if self.holds_in_place else super().safe_action()

    def health(self):
        return self.device.health()


@dataclass(frozen=True)
class Faults:
    """Injected faults of the link, for testing the whole path (not for robots)."""

    latency_s: float = 0.0
    """Delay before every reply (STATUS excepted)."""
    drop_probability: float = 0.0
    """Chance that a reply is computed, cached, and then not sent."""
    seed: int = 0
    """Seed of the drop draws."""


@dataclass(frozen=True)
class DriverDeadlines:
    """Seconds each driver call may take before the driver counts as hung.

    ``None`` derives one from the control period ``T``: ``command``,
    ``read_observation`` (with ``health``) and the safe action
    ``max(10 T, 0.5)``; ``reset`` (and ``open``, ``close``) ``max(100 T, 10)``.
    A false alarm is dear (the latch needs a restart), so they are generous.
    """

    command_s: float | None = None
    read_s: float | None = None
    safe_s: float | None = None
    reset_s: float | None = None

    def resolve(self, control_period_s: float) -> DriverDeadlines:
        short, long = max(10 * control_period_s, 0.5), max(100 * control_period_s, 10.0)
        out = DriverDeadlines(*(short if v is None else v for v in (self.command_s, self.read_s, self.safe_s)),
                              long if self.reset_s is None else self.reset_s)
        for name in ("command_s", "read_s", "safe_s", "reset_s"):
            if not getattr(out, name) > 0:
                raise ValueError(f"DriverDeadlines.{name} must be > 0, got {getattr(out, name)}")
        return out


@dataclass
class ServerStats:
    requests: int = 0
    steps: int = 0
    replays: int = 0
    """Repeated seqs answered from the cache (a retry after a lost reply)."""
    stale: int = 0
    dropped_replies: int = 0
    watchdog_trips: int = 0
    sessions: int = 0
    resumed: int = 0
    """HELLOs of the session's own key from a fresh socket (a restarted actor)."""
    takeovers_refused: int = 0
    admin_releases: int = 0
    clears_refused: int = 0
    """CLEARs that left a latch their sender may not lift (the latch stays)."""
    out_of_bounds: int = 0
    """STEPs whose action left the bounds (refused or clipped)."""
    clipped: int = 0
    rate_limited: int = 0
    """Messages from peers without a session dropped unread over the rate limit."""
    hello_reserve: int = 0
    """HELLOs let in by the HELLO reserve (the shared bucket was spent, by a flood or others)."""
    rejected: dict[str, int] = field(default_factory=dict)


@dataclass
class _Session:
    identity: bytes
    key: str | None
    """The CurveZMQ key that owns the session (None without keys: the identity owns it)."""
    last_seq: int
    reply: list | None = None
    last_seen: float = 0.0
    last_command: float = 0.0
    armed: bool = False


class _Refusal(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class RobotServer:
    """Serves one :class:`RobotDriver` to one controlling actor at a time.

    ``keys`` (CurveZMQ) encrypt the link and admit only the authorised
    actors' keys and ``admin_keys`` (a directory of public keys whose CLEAR
    releases any session); without keys, ``bind`` must be loopback unless
    ``allow_insecure``.
    """

    def __init__(self, driver: RobotDriver, bind: str = "tcp://127.0.0.1:*", *, watchdog_s: float = 0.5,
                 faults: Faults = Faults(), limits: Limits = ROBOT_LIMITS, keys: ServerKeys | None = None,
                 admin_keys: str | Path | None = None, allow_insecure: bool = False,
                 on_out_of_bounds: str = "refuse", deadlines: DriverDeadlines = DriverDeadlines(),
                 rate_limits: RateLimits = DEFAULT_RATE_LIMITS, max_messages_per_poll: int = 64,
                 context: zmq.Context | None = None):
        if not watchdog_s > 0:
            raise ValueError(f"watchdog_s must be > 0, got {watchdog_s}")
        if on_out_of_bounds not in ("refuse", "clip"):
            raise ValueError(f"on_out_of_bounds must be 'refuse' or 'clip', got {on_out_of_bounds!r}")
        if admin_keys is not None and keys is None:
            raise ValueError("admin_keys need keys: an admin is known by its CurveZMQ key")
        check_endpoint(bind, keys is not None, allow_insecure)
        self.driver = driver
        self.watchdog_s = watchdog_s
        self.faults = faults
        self.limits = limits
        self.on_out_of_bounds = on_out_of_bounds
        self.deadlines = deadlines.resolve(driver.control_period_s)
        self.max_messages_per_poll = max_messages_per_poll
        self.stats = ServerStats()
        self.session: _Session | None = None
        self.latches = Latches()
        """The e-stops latched now, each with who set it (see :mod:`.estop`)."""
        self.hung: DriverHung | None = None
        """The driver call that overran its deadline; latched for the server's lifetime."""
        self.safe_action_error: str | None = None
        self.last_action: np.ndarray | None = None
        """The newest action sent to the driver (by the actor or the watchdog)."""
        self._admins = public_keys(admin_keys) if admin_keys is not None else {}
        self._authorized_dir = None if keys is None else keys.authorized_dir
        self._key_names: dict[str, str] = {}
        self._rng = np.random.default_rng(faults.seed)
        self._limiter = RateLimiter(rate_limits, time.monotonic())
        self._lock = threading.Lock()
        self._secured = keys is not None
        self._server = ServerSocket(bind, keys, *([admin_keys] if admin_keys is not None else []), context=context,
                                    options={zmq.MAXMSGSIZE: limits.max_message_bytes + limits.max_header_bytes,
                                             zmq.RCVHWM: 1024})
        self.socket, self.endpoint = self._server.socket, self._server.endpoint
        try:
            self._worker = DriverWorker(name="robot-driver")
            self._worker.call("open", driver.open, deadline_s=self.deadlines.reset_s)
        except BaseException:
            self._close_socket()
            raise
        self._closing = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="robot-watchdog", daemon=True)
        self._watchdog.start()

    @property
    def estop_reason(self) -> str | None:
        """The reasons of every latched e-stop, most binding first; None when none is latched."""
        return self.latches.summary()

    def close(self) -> None:
        """Stop the watchdog, command the safe action, release the socket and the driver."""
        if self.socket.closed:
            return
        self._closing.set()
        self._watchdog.join(5)
        for name, fn, deadline in (("safe_action", self._do_safe, self.deadlines.safe_s),
                                   ("close", self.driver.close, self.deadlines.reset_s)):
            try:
                self._worker.call(name, fn, deadline_s=deadline)
            except DriverHung as err:
                log.error("robot server closing: %s; the driver thread is left behind", err)
                break
            except Exception as err:  # closing anyway
                log.error("robot server closing: driver %s failed: %s: %s", name, type(err).__name__, err)
        self._worker.stop(0.5)
        self._close_socket()

    def _close_socket(self) -> None:
        self._server.close()

    def serve(self, stop: threading.Event | None = None, duration_s: float | None = None) -> None:
        """Handle requests until ``stop`` is set or time is up (the watchdog runs on its own thread)."""
        end = None if duration_s is None else time.monotonic() + duration_s
        while not (stop is not None and stop.is_set()) and (end is None or time.monotonic() < end):
            self.poll(0.05)

    def poll(self, timeout_s: float) -> None:
        """Handle up to ``max_messages_per_poll`` requests that arrive within ``timeout_s``."""
        if not self.socket.poll(timeout_s * 1000):
            return
        for _ in range(self.max_messages_per_poll):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._receive(frames)

    # -- requests --------------------------------------------------------
    def _receive(self, frames: list) -> None:
        identity, body = frames[0].bytes, frames[1:]
        key = peer_key(body[0]) if self._secured and body else None
        with self._lock:
            self.stats.requests += 1
            bucket = None
            if not self._owns(identity, key):
                owner = key is not None and self.session is not None and key == self.session.key
                bucket = self._limiter.allow(key or identity, time.monotonic(), owner=owner, hello=_may_be_hello(body))
                if bucket is None:
                    self.stats.rate_limited += 1  # before decoding: a flood costs a bucket lookup
                    return
        try:
            msg = decode(body, self.limits)
        except MessageError as err:
            if bucket != "hello":
                self._reject(identity, None, err.reason, str(err))
            return
        if bucket == "hello":
            with self._lock:
                if msg.kind != HELLO:  # let in as a HELLO, and not one: it gets nothing more
                    self.stats.rate_limited += 1
                    return
                self.stats.hello_reserve += 1
        seq = msg.fields.get("seq")
        if type(seq) is not int:
            self._reject(identity, None, "bad_seq", f"{msg.kind}: fields lack an integer 'seq'")
            return
        if msg.kind == STATUS:
            with self._lock:
                status = self.status()
            self._send(identity, encode(OK, {"seq": seq, **status}), faulty=False)
            return
        if msg.kind == HELLO:
            self._hello(identity, key, seq)
            return
        with self._lock:
            session = self.session
            owner = self._owns(identity, key)
            if owner:
                session.last_seen = time.monotonic()
        if not owner:
            if key in self._admins and msg.kind in (CLEAR, ESTOP):
                self._send(identity, self._admin(key, msg.kind, seq, msg))
            else:
                self._reject(identity, seq, NO_SESSION, f"{msg.kind}: send HELLO first (or the session expired)")
            return
        if seq == session.last_seq:
            self._replay(session)
            return
        if seq < session.last_seq:
            self.stats.stale += 1
            return
        session.last_seq = seq
        try:
            reply = self._execute(session, msg.kind, seq, msg)
        except _Refusal as err:
            reply = self._error(seq, err.reason, err.detail)
        self._reply(session, reply)

    def _owns(self, identity: bytes, key: str | None) -> bool:
        session = self.session
        return session is not None and session.identity == identity and session.key == key

    def _hello(self, identity: bytes, key: str | None, seq: int) -> None:
        with self._lock:
            now, session = time.monotonic(), self.session
            if session is not None and session.identity == identity and seq == session.last_seq:
                replay = True
            elif session is not None and self._secured and key == session.key:
                session.identity, session.last_seq, session.last_seen = identity, seq, now  # resume
                self.stats.resumed += 1
                replay = False
            elif session is not None and (self._secured or (session.identity != identity
                                                            and now - session.last_seen <= self.watchdog_s)):
                self.stats.takeovers_refused += 1
                reason = ("another key controls this robot (until it says BYE or an admin CLEARs)"
                          if self._secured else "another actor controls this robot")
                self._send(identity, encode(REFUSED, {"seq": seq, "reason": reason}))
                return
            else:
                if session is not None:  # a silent identity's session (no keys): stop, then hand over
                    session.armed = False
                    self._submit_safe()
                session = self.session = _Session(identity, key, seq, last_seen=now)
                self.stats.sessions += 1
                replay = False
        if replay:
            self._replay(session)
        else:
            self._reply(session, encode(SPECS, {"seq": seq, **self._specs()}))

    def _admin(self, key: str, kind: str, seq: int, msg) -> list:
        """An admin key's ESTOP or CLEAR, from outside the session.

        ESTOP latches the admin's e-stop and commands the safe action. CLEAR lifts every latch software
        may lift; with ``release`` (default true) it also commands the safe action and releases the
        session, with ``release=false`` (a console lifting an e-stop) the actor keeps its session."""
        name = self._admins[key]
        release = kind == CLEAR and msg.fields.get("release", True) is not False
        with self._lock:
            session = self.session
            if kind == ESTOP:
                self.latches.set(ADMIN, str(msg.fields.get("reason", "admin e-stop")), key, name)
            else:
                lifted, left = self.latches.clear(admin=True, key=key)
                self.stats.clears_refused += bool(left)
            if session is not None and (kind == ESTOP or release):
                session.armed = False
            if release:
                self.session = None
                self.stats.admin_releases += session is not None
            call = self._submit_safe() if kind == ESTOP or release else None
        released = release and session is not None
        log.warning("admin key %r: %s%s", name, kind, " released the session" if released else "")
        try:
            if call is not None:
                self._wait(call)
            if kind == CLEAR and left:
                raise _Refusal(*refusal(lifted, left))
        except _Refusal as err:
            return self._error(seq, err.reason, err.detail)
        return encode(OK, {"seq": seq, "released": released})

    def _execute(self, session: _Session, kind: str, seq: int, msg) -> list:
        if kind == BYE:
            with self._lock:
                if self.session is session:
                    self.session = None
                session.armed = False
                call = self._submit_safe()
            self._wait(call, quiet=True)
            return encode(OK, {"seq": seq})
        if kind == ESTOP:
            with self._lock:
                reason = str(msg.fields.get("reason", "remote e-stop"))
                if session.key in self._admins:  # an admin key holds the session
                    self.latches.set(ADMIN, reason, session.key, self._admins[session.key])
                else:
                    self.latches.set(OWNER, reason, session.key, self._key_name(session.key))
                session.armed = False
                call = self._submit_safe()
            self._wait(call)
            return encode(OK, {"seq": seq})
        if kind == CLEAR:
            with self._lock:
                lifted, left = self.latches.clear(admin=session.key in self._admins, key=session.key)
                if left:
                    self.stats.clears_refused += 1
                    raise _Refusal(*refusal(lifted, left))
            return encode(OK, {"seq": seq})
        if kind not in (RESET, STEP):
            return self._error(seq, "unknown_kind", f"unknown request {kind!r}")
        if kind == RESET:
            seed = msg.fields.get("seed")
            if seed is not None and type(seed) is not int:
                return self._error(seq, "bad_seed", f"seed must be an integer or nil, got {seed!r}")
            with self._lock:
                self._check_ready()
                self.latches.lift_watchdog()  # the owner starts a new episode
                session.armed = False
                call = self._worker.submit("reset", self.driver.reset, seed, deadline_s=self.deadlines.reset_s)
            observation = self._driver_result(session, call)
            with self._lock:
                session.last_command = time.monotonic()
            health = self._driver_result(session, self._worker.submit(
                "health", self.driver.health, deadline_s=self.deadlines.read_s))
        else:
            action = self._checked_action(session, seq, msg)
            with self._lock:  # checked and queued at once: the watchdog's safe action never precedes it
                self._check_ready()
                if self.latches.has(WATCHDOG):
                    raise _Refusal(WATCHDOG_TRIPPED, f"the watchdog stopped the robot after {self.watchdog_s} s "
                                                     "without a command; reset() (or CLEAR) to continue")
                started = time.monotonic()
                run = self._command if self.driver.realtime else self._command_and_read
                call = self._worker.submit("command", run, action, deadline_s=self.deadlines.command_s)
                session.armed, session.last_command = True, started
            if self.driver.realtime:  # the control period passes off the driver thread
                self._driver_result(session, call)
                time.sleep(max(0.0, started + self.driver.control_period_s - time.monotonic()))
                call = self._worker.submit("read_observation", self._read, deadline_s=self.deadlines.read_s)
            observation, health = self._driver_result(session, call)
            self.stats.steps += 1
        try:
            observation = self.driver.observation_spec.validate(observation)
        except SpecError as err:
            return self._error(seq, "driver_fault", str(err))
        return encode(OBS, {"seq": seq, "health": health.status, "reason": health.reason}, observation)

    def _checked_action(self, session: _Session, seq: int, msg) -> np.ndarray:
        spec = self.driver.action_spec
        try:
            action = np.array(spec.validate(msg.arrays.get("action")))
        except SpecError as err:
            raise _Refusal(BAD_ACTION, str(err)) from None
        outside = _outside(spec, action)
        if outside is None:
            return action
        with self._lock:
            self.stats.out_of_bounds += 1
            if self.on_out_of_bounds == "clip":
                self.stats.clipped += 1
                return spec.clip(action)
            session.armed = False
            call = self._submit_safe()
        self._wait(call, quiet=True)
        raise _Refusal(OUT_OF_BOUNDS, f"{outside}; refused, the safe action was commanded")

    def _check_ready(self) -> None:
        if self.hung is not None:
            raise self._hung_refusal()
        blocking = self.latches.blocking()
        if blocking:
            raise _Refusal(ESTOPPED, "robot is e-stopped: " + "; ".join(latch.describe() for latch in blocking))

    def _key_name(self, key: str | None) -> str | None:
        """An authorised key's name (its file's name; the directory is read again for a key added since)."""
        if key is None:
            return None
        if key not in self._key_names and self._authorized_dir is not None:
            with contextlib.suppress(SecurityError):  # the directory went away: keep the names read last
                self._key_names = public_keys(self._authorized_dir)
        return self._key_names.get(key, key[:8])

    def _driver_result(self, session: _Session, call):
        """Wait for a driver call; a driver exception stops the arm and becomes ERROR driver_fault."""
        try:
            return self._wait(call)
        except _Refusal:
            raise
        except Exception as err:  # the SDK failed: stop the arm, tell the actor, keep serving
            if self.hung is not None:  # cancelled behind a hung call
                raise self._hung_refusal() from None
            with self._lock:
                session.armed = False
                safe = self._submit_safe()
            self._wait(safe, quiet=True)
            raise _Refusal("driver_fault", f"{call.name}: {type(err).__name__}: {err}") from None

    def _specs(self) -> dict:
        driver = self.driver
        return specs_fields(driver.observation_spec, driver.action_spec, driver.control_period_s, self.watchdog_s,
                            holds_in_place=driver.holds_in_place)

    def status(self) -> dict:
        s, hung = self.stats, self.hung
        return {"requests": s.requests, "steps": s.steps, "replays": s.replays, "stale": s.stale,
                "dropped_replies": s.dropped_replies, "watchdog_trips": s.watchdog_trips,
                "sessions": s.sessions, "resumed": s.resumed, "takeovers_refused": s.takeovers_refused,
                "admin_releases": s.admin_releases, "clears_refused": s.clears_refused,
                "out_of_bounds": s.out_of_bounds, "clipped": s.clipped,
                "on_out_of_bounds": self.on_out_of_bounds, "rate_limited": s.rate_limited,
                "hello_reserve": s.hello_reserve, "rejected": dict(s.rejected),
                "estop": self.latches.summary(), "estops": self.latches.to_msg(),
                "driver_hung": None if hung is None else hung.call,
                "driver_hung_s": None if hung is None else round(hung.seconds, 4),
                "safe_action_error": self.safe_action_error,
                "controlled": self.session is not None, "secured": self._secured,
                "last_action": None if self.last_action is None else np.asarray(self.last_action).tolist()}

    # -- the driver thread ---------------------------------------------------
    def _command(self, action: np.ndarray) -> None:
        self.last_action = action
        self.driver.command(action)

    def _read(self) -> tuple[dict, Health]:
        return self.driver.read_observation(), self.driver.health()

    def _command_and_read(self, action: np.ndarray) -> tuple[dict, Health]:
        """A simulator's step in one hand-over to the driver thread (no control period to wait out)."""
        self._command(action)
        self._worker.phase("read_observation", self.deadlines.read_s)
        return self._read()

    def _do_safe(self) -> None:
        try:
            safe = self.driver.safe_action()
            if safe is None:  # a robot that holds in place, never observed: nothing is known to hold
                return
            self._command(safe)
        except Exception as err:  # nothing more this side can do; count it and keep serving
            with self._lock:
                self.stats.rejected["safe_action_failed"] = self.stats.rejected.get("safe_action_failed", 0) + 1
                self.safe_action_error = f"{type(err).__name__}: {err}"
            log.error("robot server: the safe action failed: %s", self.safe_action_error)

    def _submit_safe(self):
        """Queue the safe action (call with the lock held, so it keeps its place among commands)."""
        return self._worker.submit("safe_action", self._do_safe, deadline_s=self.deadlines.safe_s)

    def _wait(self, call, quiet: bool = False):
        """A driver call's result; an overrun latches the hung-driver e-stop and refuses the request."""
        try:
            return self._worker.wait(call)
        except DriverHung as hung:
            with self._lock:
                self._latch_hung(hung)
            if quiet:
                return None
            raise self._hung_refusal() from None

    def _latch_hung(self, hung: DriverHung) -> None:
        """With the lock held: latch the e-stop no software clears, drop queued calls, queue a safe action."""
        if self.hung is not None:
            return
        self.hung = hung
        self.latches.set(DRIVER, f"driver hung in {hung.call}")
        if self.session is not None:
            self.session.armed = False
        self._worker.cancel_pending()
        self._submit_safe()  # runs if the driver ever returns
        log.error("robot server: driver call %r overran its %.3g s deadline; e-stop latched. Software cannot "
                  "move the robot through a hung driver: use the hardware e-stop, then restart this server.",
                  hung.call, hung.deadline_s)

    def _hung_refusal(self) -> _Refusal:
        hung = self.hung
        return _Refusal("driver_hung", f"driver call {hung.call!r} overran its {hung.deadline_s:.3g} s deadline "
                                       f"({hung.seconds:.3g} s so far); e-stop latched, not clearable by "
                                       "software: check the robot, use its hardware e-stop, restart the server")

    # -- watchdog --------------------------------------------------------
    def _watch(self) -> None:
        """The watchdog thread: trips a silent session and notices an overrunning driver call."""
        tick = min(0.05, self.watchdog_s / 4)
        while True:
            with self._lock:
                now = time.monotonic()
                wake = now + tick
                hung = self._worker.overrun()
                if hung is not None:
                    self._latch_hung(hung)
                due = self._worker.due()
                if due is not None and hung is None:
                    wake = min(wake, due + 1e-4)
                session = self.session
                if session is not None and session.armed:
                    if now - session.last_command > self.watchdog_s:
                        session.armed = False
                        self.latches.set(WATCHDOG, f"no command for {self.watchdog_s:g} s")
                        self.stats.watchdog_trips += 1
                        self._submit_safe()
                        log.warning("robot server: no command for %.3g s: watchdog commanded the safe action",
                                    now - session.last_command)
                    else:
                        wake = min(wake, session.last_command + self.watchdog_s + 1e-4)
            if self._closing.wait(max(0.0, wake - time.monotonic())):
                return

    # -- replies ---------------------------------------------------------
    def _error(self, seq: int, reason: str, detail: str) -> list:
        with self._lock:
            self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1
        return encode(ERROR, {"seq": seq, "reason": reason, "detail": detail})

    def _reject(self, identity: bytes, seq, reason: str, detail: str) -> None:
        self._send(identity, self._error(seq, reason, detail))

    def _reply(self, session: _Session, frames: list) -> None:
        session.reply = frames
        self._send(session.identity, frames)

    def _replay(self, session: _Session) -> None:
        self.stats.replays += 1
        if session.reply is not None:
            self._send(session.identity, session.reply)

    def _send(self, identity: bytes, frames: list, faulty: bool = True) -> None:
        if faulty and self.faults.latency_s > 0:
            time.sleep(self.faults.latency_s)
        if faulty and self.faults.drop_probability > 0 and self._rng.random() < self.faults.drop_probability:
            self.stats.dropped_replies += 1
            return
        self.socket.send_multipart([identity, *frames])


def _may_be_hello(body: list) -> bool:
    """Whether a message may be a HELLO, from its bytes alone (nothing decoded; a large one never is)."""
    return len(body) == 1 and len(body[0]) <= _HELLO_MAX_BYTES and _HELLO_BYTES in body[0].bytes


def _outside(spec: ArraySpec, action: np.ndarray) -> str | None:
    """Where ``action`` leaves the spec's bounds (compared in the action's dtype), or None."""
    for bound, name, beyond in ((spec.minimum, "minimum", np.less), (spec.maximum, "maximum", np.greater)):
        if bound is None:
            continue
        limit = bound.astype(spec.dtype) if spec.dtype.kind == "f" else bound
        bad = np.flatnonzero(beyond(action, limit).reshape(-1))
        if bad.size:
            i = int(bad[0])
            return (f"{spec.name}: value {action.reshape(-1)[i]} beyond its {name} {limit.reshape(-1)[i]} "
                    f"at flat index {i} ({bad.size} of {action.size} values out of bounds)")
    return None


def load_factory(spec: str):
    """``"package.module:callable"`` -> the callable (how a server names its driver)."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"driver factory {spec!r} must look like 'package.module:callable'")
    return getattr(import_module(module), attr)


def serve_process(factory, bind: str, endpoint_queue=None, watchdog_s: float = 0.5,
                  faults: Faults = Faults(), **options) -> None:
    """Build the driver from ``factory`` and serve until SIGTERM or SIGINT (a process entry point).

    The factory returns a :class:`RobotDriver` or a :class:`Device` (wrapped in
    :class:`DeviceDriver`); ``"embodyrl.envs.arm:make_device"`` is the
    simulated arm; ``factory`` may also be what a factory built (``embodyrl
    robot-server`` builds a robot file's device). The bound endpoint is put on
    ``endpoint_queue``. ``options`` go to :class:`RobotServer` (``keys``,
    ``admin_keys``, ...).
    """
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    built = _factory_only(factory) if isinstance(factory, str) else factory
    driver = DeviceDriver(built) if isinstance(built, Device) else built
    if not isinstance(driver, RobotDriver):
        from .lerobot import is_robot

        hint = (" A LeRobot robot needs its bounds: declare it in a robot file and serve that with "
                "embodyrl robot-server FILE, or return embodyrl.hal.drivers.lerobot.wrap(robot, bounds)"
                if is_robot(built) else "")
        raise ValueError(f"{factory}: made a {type(built).__name__}, not a RobotDriver or a Device.{hint}")
    server = RobotServer(driver, bind, watchdog_s=watchdog_s, faults=faults, **options)
    try:
        if endpoint_queue is not None:
            endpoint_queue.put(server.endpoint)
        else:
            print(f"robot server on {server.endpoint}", flush=True)
        server.serve(stop)
    finally:
        server.close()


def add_arguments(parser) -> None:
    """The robot server's options (``python -m embodyrl.hal.robot_server`` and ``embodyrl robot-server``)."""
    parser.add_argument("factory", help="package.module:callable returning a RobotDriver or a Device, "
                                        "e.g. embodyrl.envs.arm:make_device (the simulated arm); with "
                                        "embodyrl robot-server also a robot file (*.yaml), e.g. a LeRobot "
                                        "robot with its bounds")
    parser.add_argument("--bind", default="tcp://127.0.0.1:5556",
                        help="the address to serve on (default tcp://127.0.0.1:5556; off this machine needs keys)")
    parser.add_argument("--watchdog-s", type=float, default=0.5,
                        help="command the safe action when the actor sends nothing for this long (default 0.5)")
    parser.add_argument("--on-out-of-bounds", choices=("refuse", "clip"), default="refuse",
                        help="an action outside the spec's bounds: refuse it (ERROR, safe action) or clip it")
    parser.add_argument("--command-deadline-s", type=float, help="driver command/read deadline "
                                                                 "(default max(10 control periods, 0.5 s))")
    parser.add_argument("--reset-deadline-s", type=float, help="driver reset deadline (default max(100 periods, 10 s))")
    parser.add_argument("--latency-s", type=float, default=0.0, help="injected reply latency (testing)")
    parser.add_argument("--drop", type=float, default=0.0, help="injected reply-drop probability (testing)")
    group = parser.add_argument_group("security (CurveZMQ; keys from: embodyrl keys DIR NAME)")
    group.add_argument("--secret-key", metavar="FILE", help="this robot server's NAME.key_secret")
    group.add_argument("--authorized-keys", metavar="DIR", help="directory of the actors' public NAME.key files")
    group.add_argument("--admin-keys", metavar="DIR", help="directory of admins' public keys: their ESTOP "
                                                           "latches an e-stop only an admin lifts; their CLEAR "
                                                           "lifts any software e-stop (and, unless sent with "
                                                           "release=false, releases the session)")
    group.add_argument("--insecure", action="store_true",
                       help="allow plain TCP on a non-loopback address: anyone who reaches the port can "
                            "drive the robot (default: refused without keys)")


def _factory_only(source: str):
    if source.lower().endswith((".yaml", ".yml")):
        raise ValueError(f"a robot file is served by: embodyrl robot-server {source} (this module serves "
                         "package.module:callable factories)")
    return load_factory(source)()


def run(args, build=_factory_only) -> int:
    """Serve what ``build(args.factory)`` returns under ``args`` (:func:`add_arguments`); exit code 2 on
    a bad option or a robot that cannot be built or opened (the message names why)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        keys = server_keys(args)
        check_address(args.bind, keys, args.insecure, "--bind")
        if args.admin_keys is not None and (keys is None or not Path(args.admin_keys).is_dir()):
            raise SecurityOptionError("--admin-keys: needs --secret-key and --authorized-keys, and a directory")
    except SecurityOptionError as err:
        print(f"robot server: {err}", file=sys.stderr)
        return 2
    deadlines = DriverDeadlines(args.command_deadline_s, args.command_deadline_s, args.command_deadline_s,
                                args.reset_deadline_s)
    try:
        built = build(args.factory)
    except ModuleNotFoundError:  # an extra this install lacks: embodyrl robot-server names it
        raise
    except (ValueError, ImportError, AttributeError) as err:  # a robot file's error names file and field
        print(f"robot server: {args.factory}: {err}", file=sys.stderr)
        return 2
    try:
        serve_process(built, args.bind, watchdog_s=args.watchdog_s, faults=Faults(args.latency_s, args.drop),
                      keys=keys, admin_keys=args.admin_keys, allow_insecure=args.insecure,
                      on_out_of_bounds=args.on_out_of_bounds, deadlines=deadlines)
    except ValueError as err:  # the robot refused to open (a LeRobot arm not calibrated, ...)
        print(f"robot server: {err}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m embodyrl.hal.robot_server FACTORY [options]``; exit code 2 on a bad option."""
    import argparse

    parser = argparse.ArgumentParser(description="Serve a robot driver to a remote actor.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
