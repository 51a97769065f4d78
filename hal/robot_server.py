"""The robot server: runs next to the hardware and drives it for one remote actor.

A robot's controller box runs this server around a :class:`RobotDriver` (the
small class a user writes against the vendor SDK); the actor drives it as a
normal device through :class:`~embodyrl.hal.drivers.remote.RemoteDevice`.

Protocol (ROUTER here, DEALER on the actor; every message is the HAL wire
codec's ``[msgpack header, raw array frames]``). Every request carries a
``seq`` in its fields; every reply echoes it::

    HELLO  {seq}                 -> SPECS {seq, observation_spec, action_spec,
                                           control_period_s, watchdog_s}
                                  | REFUSED {seq, reason}   (another actor is in control)
    RESET  {seq, seed}           -> OBS {seq, health, reason} + observation arrays
    STEP   {seq} + action        -> OBS ...                  | ERROR {seq, reason, detail}
    ESTOP  {seq, reason}         -> OK {seq}   (safe action now; latches until CLEAR)
    CLEAR  {seq}                 -> OK {seq}
    STATUS {seq}                 -> OK {seq, counters...}    (anyone may ask; monitoring)
    BYE    {seq}                 -> OK {seq}   (safe action, session released)

Sequence numbers make retries idempotent: the server caches its last reply
and replays it for a repeated ``seq`` instead of stepping twice, and ignores
older ones, so an actor whose reply was lost simply sends the same request
again. Deadlines are the actor's: it waits ``timeout_s`` per attempt and
retries a bounded number of times.

The watchdog lives here, next to the hardware: once the actor has stepped
the robot, a gap of more than ``watchdog_s`` without a fresh command (a dead
actor, a dead link, a stalled learner) commands the driver's safe action and
refuses further steps until the actor resets. An actor silent for longer
than ``watchdog_s`` also loses its session, so a restarted actor can take
over.
"""

from __future__ import annotations

import abc
import signal
import threading
import time
from dataclasses import dataclass, field
from importlib import import_module

import numpy as np
import zmq

from .device import Device, Health
from .specs import ArraySpec, DictSpec, SpecError
from .wire.codec import DEFAULT_LIMITS, Limits, MessageError, decode, encode

HELLO, SPECS, REFUSED = "HELLO", "SPECS", "REFUSED"
RESET, STEP, OBS = "RESET", "STEP", "OBS"
ESTOP, CLEAR, STATUS, BYE, OK, ERROR = "ESTOP", "CLEAR", "STATUS", "BYE", "OK", "ERROR"


class RobotDriver(abc.ABC):
    """What a user writes to put a real arm behind the server (see ``examples/``).

    The server calls, for each actor step: ``command(action)``, then (for a
    ``realtime`` robot) waits out ``control_period_s``, then
    ``read_observation()``. ``safe_action()`` is what the watchdog and the
    e-stop command. All methods run on the server's thread.
    """

    observation_spec: DictSpec
    action_spec: ArraySpec
    control_period_s: float
    realtime: bool = True
    """Whether the server waits out the control period between command and read."""

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

    def safe_action(self) -> np.ndarray:
        """The action that stops the robot (default: zeros, clipped into the bounds).

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
        return super().safe_action() if self._safe is None else self._safe

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
    rejected: dict[str, int] = field(default_factory=dict)


@dataclass
class _Session:
    identity: bytes
    last_seq: int
    reply: list | None = None
    last_seen: float = 0.0
    last_command: float = 0.0
    armed: bool = False
    tripped: bool = False


class RobotServer:
    """Serves one :class:`RobotDriver` to one controlling actor at a time."""

    def __init__(self, driver: RobotDriver, bind: str = "tcp://127.0.0.1:*", *, watchdog_s: float = 0.5,
                 faults: Faults = Faults(), limits: Limits = DEFAULT_LIMITS,
                 context: zmq.Context | None = None):
        if not watchdog_s > 0:
            raise ValueError(f"watchdog_s must be > 0, got {watchdog_s}")
        self.driver = driver
        self.watchdog_s = watchdog_s
        self.faults = faults
        self.limits = limits
        self.stats = ServerStats()
        self.session: _Session | None = None
        self.estop_reason: str | None = None
        self.safe_action_error: str | None = None
        self.last_action: np.ndarray | None = None
        """The newest action sent to the driver (by the actor or the watchdog)."""
        self._rng = np.random.default_rng(faults.seed)
        self._context = context or zmq.Context.instance()
        self.socket = self._context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.bind(bind)
        self.endpoint = self.socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        driver.open()

    def close(self) -> None:
        if not self.socket.closed:
            self._command_safe()
            self.socket.close()
            self.driver.close()

    def serve(self, stop: threading.Event | None = None, duration_s: float | None = None) -> None:
        """Handle requests and run the watchdog until ``stop`` is set or time is up."""
        end = None if duration_s is None else time.monotonic() + duration_s
        tick = min(0.05, self.watchdog_s / 4)
        while not (stop is not None and stop.is_set()) and (end is None or time.monotonic() < end):
            self.poll(tick)

    def poll(self, timeout_s: float) -> None:
        """Handle the requests that arrive within ``timeout_s``, then check the watchdog."""
        if self.socket.poll(timeout_s * 1000):
            while True:
                try:
                    frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._handle(frames[0].bytes, frames[1:])
        self._check_watchdog()

    # -- requests --------------------------------------------------------
    def _handle(self, identity: bytes, frames: list) -> None:
        self.stats.requests += 1
        try:
            msg = decode(frames, self.limits)
        except MessageError as err:
            self._reject(identity, None, err.reason, str(err))
            return
        seq = msg.fields.get("seq")
        if type(seq) is not int:
            self._reject(identity, None, "bad_seq", f"{msg.kind}: fields lack an integer 'seq'")
            return
        now = time.monotonic()
        if msg.kind == STATUS:
            self._send(identity, encode(OK, {"seq": seq, **self.status()}), faulty=False)
            return
        session = self.session
        if msg.kind == HELLO:
            if session is not None and session.identity == identity and seq == session.last_seq:
                self._replay(session)
            elif session is not None and session.identity != identity and now - session.last_seen <= self.watchdog_s:
                self._send(identity, encode(REFUSED, {"seq": seq, "reason": "another actor controls this robot"}))
            else:
                if session is not None:
                    self._command_safe()
                self.session = _Session(identity, seq, last_seen=now)
                self.stats.sessions += 1
                self._reply(self.session, encode(SPECS, {"seq": seq, **self._specs()}))
            return
        if session is None or session.identity != identity:
            self._reject(identity, seq, "no_session", f"{msg.kind}: send HELLO first (or the session expired)")
            return
        session.last_seen = now
        if seq == session.last_seq:
            self._replay(session)
            return
        if seq < session.last_seq:
            self.stats.stale += 1
            return
        session.last_seq = seq
        try:
            reply = self._execute(session, msg.kind, seq, msg)
        except Exception as err:  # the SDK failed: stop the arm, tell the actor, keep serving
            session.armed = False
            self._try_safe()
            reply = self._error(seq, "driver_fault", f"{msg.kind}: {type(err).__name__}: {err}")
        self._reply(session, reply)

    def _execute(self, session: _Session, kind: str, seq: int, msg) -> list:
        if kind == BYE:
            self._command_safe()
            self.session = None
            return encode(OK, {"seq": seq})
        if kind == ESTOP:
            self.estop_reason = str(msg.fields.get("reason", "remote e-stop"))
            self._command_safe()
            session.armed = False
            return encode(OK, {"seq": seq})
        if kind == CLEAR:
            self.estop_reason = None
            return encode(OK, {"seq": seq})
        if kind not in (RESET, STEP):
            return self._error(seq, "unknown_kind", f"unknown request {kind!r}")
        if self.estop_reason is not None:
            return self._error(seq, "estopped", f"robot is e-stopped ({self.estop_reason}); CLEAR first")
        if kind == RESET:
            seed = msg.fields.get("seed")
            if seed is not None and type(seed) is not int:
                return self._error(seq, "bad_seed", f"seed must be an integer or nil, got {seed!r}")
            observation = self.driver.reset(seed)
            session.tripped = session.armed = False
            session.last_command = time.monotonic()
        else:
            if session.tripped:
                return self._error(seq, "watchdog", f"the watchdog stopped the robot after {self.watchdog_s} s "
                                                    "without a command; reset() to continue")
            try:
                action = self.driver.action_spec.validate(msg.arrays.get("action"))
            except SpecError as err:
                return self._error(seq, "bad_action", str(err))
            started = time.monotonic()
            self._command(np.array(action))
            if self.driver.realtime:
                time.sleep(max(0.0, started + self.driver.control_period_s - time.monotonic()))
            observation = self.driver.read_observation()
            session.armed, session.last_command = True, time.monotonic()
            self.stats.steps += 1
        try:
            observation = self.driver.observation_spec.validate(observation)
        except SpecError as err:
            return self._error(seq, "driver_fault", str(err))
        health = self.driver.health()
        return encode(OBS, {"seq": seq, "health": health.status, "reason": health.reason}, observation)

    def _specs(self) -> dict:
        return {"observation_spec": self.driver.observation_spec.to_msg(),
                "action_spec": self.driver.action_spec.to_msg(),
                "control_period_s": float(self.driver.control_period_s), "watchdog_s": self.watchdog_s}

    def status(self) -> dict:
        s = self.stats
        return {"requests": s.requests, "steps": s.steps, "replays": s.replays, "stale": s.stale,
                "dropped_replies": s.dropped_replies, "watchdog_trips": s.watchdog_trips,
                "sessions": s.sessions, "rejected": dict(s.rejected), "estop": self.estop_reason,
                "controlled": self.session is not None,
                "last_action": None if self.last_action is None else np.asarray(self.last_action).tolist()}

    # -- watchdog --------------------------------------------------------
    def _check_watchdog(self) -> None:
        session = self.session
        if session is None:
            return
        now = time.monotonic()
        if session.armed and now - session.last_command > self.watchdog_s:
            session.armed, session.tripped = False, True
            self.stats.watchdog_trips += 1
            self._try_safe()

    def _command_safe(self) -> None:
        self._command(self.driver.safe_action())

    def _try_safe(self) -> None:
        try:
            self._command_safe()
        except Exception as err:  # nothing more this side can do; count it and keep serving
            self.stats.rejected["safe_action_failed"] = self.stats.rejected.get("safe_action_failed", 0) + 1
            self.safe_action_error = f"{type(err).__name__}: {err}"

    def _command(self, action: np.ndarray) -> None:
        self.last_action = action
        self.driver.command(action)

    # -- replies ---------------------------------------------------------
    def _error(self, seq: int, reason: str, detail: str) -> list:
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


def load_factory(spec: str):
    """``"package.module:callable"`` -> the callable (how a server names its driver)."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"driver factory {spec!r} must look like 'package.module:callable'")
    return getattr(import_module(module), attr)


def serve_process(factory: str, bind: str, endpoint_queue=None, watchdog_s: float = 0.5,
                  faults: Faults = Faults()) -> None:
    """Build the driver from ``factory`` and serve until SIGTERM or SIGINT (a process entry point).

    The factory returns a :class:`RobotDriver` or a :class:`Device` (wrapped in
    :class:`DeviceDriver`); ``"embodyrl.envs.arm:make_device"`` is the
    simulated arm. The bound endpoint is put on ``endpoint_queue``.
    """
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    built = load_factory(factory)()
    driver = DeviceDriver(built) if isinstance(built, Device) else built
    server = RobotServer(driver, bind, watchdog_s=watchdog_s, faults=faults)
    try:
        if endpoint_queue is not None:
            endpoint_queue.put(server.endpoint)
        else:
            print(f"robot server on {server.endpoint}", flush=True)
        server.serve(stop)
    finally:
        server.close()


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Serve a robot driver to a remote actor.")
    parser.add_argument("factory", help="package.module:callable returning a RobotDriver or a Device, "
                                        "e.g. embodyrl.envs.arm:make_device (the simulated arm)")
    parser.add_argument("--bind", default="tcp://127.0.0.1:5556")
    parser.add_argument("--watchdog-s", type=float, default=0.5)
    parser.add_argument("--latency-s", type=float, default=0.0, help="injected reply latency (testing)")
    parser.add_argument("--drop", type=float, default=0.0, help="injected reply-drop probability (testing)")
    args = parser.parse_args(argv)
    serve_process(args.factory, args.bind, watchdog_s=args.watchdog_s,
                  faults=Faults(args.latency_s, args.drop))


if __name__ == "__main__":
    main()
