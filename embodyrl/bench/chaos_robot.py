"""Chaos at the robot server: flood it while the actor goes silent, and time the watchdog.

The server (the simulated arm behind a :class:`~embodyrl.hal.robot_server.RobotServer`)
runs in its own process and notes the time of every command its driver
receives. The actor (this process) resets, steps, and goes silent; the
watchdog must command the safe action ``watchdog_s`` after the last command
however busy the socket is. A flooder process sends STATUS requests and junk
from fresh ZeroMQ identities as fast as they go out, niced so that on a small
machine the figure measures the server, not the flooder's share of the cores.
The delay is measured from the driver's last actor command to its safe
action, on the machine-wide monotonic clock, quiet first, then under the flood.

:func:`reconnect_under_flood` floods the same way from three processes while
a restarted actor (keyless: a new connection) asks for its session back, and
times its HELLO to SPECS (``restarted_actor_reconnect_s_under_flood``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time

import numpy as np

CTX = mp.get_context("spawn")
WATCHDOG_S = 0.1


def flood(endpoint: str, stop, report=None, ready=None, sockets: int = 8, renew_every: int = 500,
          niceness: int = 19, progress=None) -> None:
    """Process target: STATUS, junk and sessionless STEPs to ``endpoint`` as fast as ZeroMQ takes them.

    Every ``renew_every`` messages one socket is replaced by a fresh one (a new
    ZeroMQ identity). Sets ``ready`` once the first thousand are out; keeps
    ``progress`` (a shared integer) at the count sent so far; puts
    ``(messages sent, seconds)`` on ``report`` when ``stop`` is set.
    """
    import msgpack
    import zmq

    os.nice(niceness)
    context = zmq.Context()

    def header(kind: str, seq: int, padding: int = 0) -> bytes:  # the codec's header, without importing it
        return msgpack.packb({"p": 2, "k": kind, "f": {"seq": seq, "pad": [1] * padding}, "a": []})

    # mostly STATUS requests padded to a few KiB: cheap to send, dear to decode
    messages = [[header("STATUS", 1, 30000)]] * 6 + [[header("STATUS", 2)], [b"\xc1 not msgpack"],
                                                   [b"x" * 64, b"y"], [header("STEP", 7, 30000)]]

    def fresh():
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        sock.setsockopt(zmq.RCVHWM, 16)  # replies (if any) are not read
        sock.connect(endpoint)
        return sock

    pool = [fresh() for _ in range(sockets)]
    sent, started, i = 0, time.monotonic(), 0
    while True:
        i += 1
        if i % 256 == 0:
            if progress is not None:
                progress.value = sent
            if stop.is_set():
                break
        try:
            pool[i % sockets].send_multipart(messages[i % len(messages)], zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            continue
        if sent == 1000 and ready is not None:
            ready.set()
        if sent % renew_every == 0:
            slot = (sent // renew_every) % sockets
            pool[slot].close()
            pool[slot] = fresh()
    elapsed = time.monotonic() - started
    for sock in pool:
        sock.close()
    context.term()
    if report is not None:
        report.put((sent, elapsed))


def _recording_arm():
    from embodyrl.envs import arm
    from embodyrl.hal.robot_server import DeviceDriver

    class RecordingArm(DeviceDriver):
        """The simulated arm; notes (monotonic time, is the safe action) for every command."""

        def __init__(self):
            super().__init__(arm.make_device())
            self.commands: list[tuple[float, bool]] = []

        def command(self, action):
            self.commands.append((time.monotonic(), bool(np.array_equal(action, self.safe_action()))))
            super().command(action)

    return RecordingArm()


def serve_recording(endpoint_queue, stop, records, watchdog_s: float) -> None:
    """Process target: the recording arm behind a RobotServer until ``stop``; then its commands and STATUS."""
    import logging

    from embodyrl.hal.robot_server import RobotServer

    logging.getLogger("embodyrl.hal.robot_server").setLevel(logging.ERROR)  # trips are the point here
    driver = _recording_arm()
    server = RobotServer(driver, watchdog_s=watchdog_s)
    endpoint_queue.put((server.endpoint, driver.control_period_s))
    try:
        server.serve(stop)
    finally:
        records.put({"commands": list(driver.commands), "status": server.status()})
        server.close()


def watchdog_delays(commands: list[tuple[float, bool]], since: float, until: float) -> list[float]:
    """Seconds from the last actor command to the safe action after it, for each trip in [since, until)."""
    delays = []
    for (t0, safe0), (t1, safe1) in zip(commands, commands[1:], strict=False):
        if not safe0 and safe1 and since <= t0 < until:
            delays.append(t1 - t0)
    return delays


def _trips(device, n: int, steps: int, silence_s: float) -> int:
    """``n`` trips of ``steps`` commands then a silence; the commands the server took. A trip this actor
    itself paused past the watchdog (a busy machine) ends there: that pause was its silence, and its trip."""
    from embodyrl.hal.drivers.remote import WatchdogStopped

    action = np.full(device.action_spec.shape, 1.0, np.float32)
    produced = 0
    for _ in range(n):
        device.reset(seed=0)
        try:
            for _ in range(steps):
                device.step(action)
                produced += 1
        except WatchdogStopped:
            continue
        time.sleep(silence_s)  # silent: the watchdog must stop the arm
    return produced


def _stop(process) -> None:
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)


def watchdog_under_flood(quick: bool = False, flood_messages: int | None = None) -> dict:
    """The watchdog's delay with and without a flood of sessionless requests (medians over trips).

    The flooded trips go on past ``trips`` until the flooder has sent
    ``flood_messages`` (default 3,000 quick, 20,000 full) while they ran, so
    the figure is measured under a flood even where a busy machine leaves the
    niced flooder little CPU; ``flood_messages_during_trips`` says how many.
    """
    from embodyrl.hal.drivers.remote import RemoteDevice

    trips, steps = (3, 5) if quick else (10, 10)
    flood_messages = (3_000 if quick else 20_000) if flood_messages is None else flood_messages
    silence_s = 3 * WATCHDOG_S
    endpoints, records, report = CTX.Queue(), CTX.Queue(), CTX.Queue()
    stop_server, stop_flood, flooding = CTX.Event(), CTX.Event(), CTX.Event()
    progress = CTX.Value("q", 0, lock=False)
    server = CTX.Process(target=serve_recording, args=(endpoints, stop_server, records, WATCHDOG_S), daemon=True)
    server.start()
    flooder = None
    try:
        endpoint, control_period_s = endpoints.get(timeout=120)
        with RemoteDevice(endpoint, timeout_s=1.0, retries=2) as device:
            quiet_start = time.monotonic()
            produced = _trips(device, trips, steps, silence_s)
            flooder = CTX.Process(target=flood, args=(endpoint, stop_flood, report, flooding),
                                  kwargs={"progress": progress}, daemon=True)
            flooder.start()
            if not flooding.wait(120):
                raise RuntimeError("the flooder did not start")
            time.sleep(0.2)
            flood_start, sent_before = time.monotonic(), progress.value
            flooded_trips, give_up = 0, flood_start + 120
            while flooded_trips < trips or (progress.value - sent_before < flood_messages
                                            and time.monotonic() < give_up):
                produced += _trips(device, 1, steps, silence_s)
                flooded_trips += 1
            flood_end, sent_during = time.monotonic(), progress.value - sent_before
            stop_flood.set()
            sent, flood_s = report.get(timeout=30)
        stop_server.set()
        record = records.get(timeout=30)
    finally:
        stop_flood.set()
        stop_server.set()
        for process in (flooder, server):
            if process is not None:
                _stop(process)
    commands, status = record["commands"], record["status"]
    quiet = watchdog_delays(commands, quiet_start, flood_start)
    flooded = watchdog_delays(commands, flood_start, flood_end)
    stored = sum(1 for _, safe in commands if not safe)
    bound_s = WATCHDOG_S + control_period_s
    return {"name": "robot_watchdog_under_flood", "injected": flooded_trips, "produced": produced,
            "stored": stored, "lost": max(0, produced - stored), "duplicated": max(0, stored - produced),
            "robot_watchdog_delay_ms_under_flood": 1e3 * statistics.median(flooded) if flooded else None,
            "robot_watchdog_delay_ms_under_flood_max": 1e3 * max(flooded) if flooded else None,
            "robot_watchdog_delay_ms_quiet": 1e3 * statistics.median(quiet) if quiet else None,
            "watchdog_delays_ms_under_flood": [round(1e3 * d, 2) for d in flooded],
            "watchdog_trips_under_flood": len(flooded), "flooded_trips": flooded_trips,
            "watchdog_trips_reported": status.get("watchdog_trips"),
            "within_bound": len(flooded) == flooded_trips and max(flooded) <= bound_s,
            "bound_ms": 1e3 * bound_s, "watchdog_s": WATCHDOG_S, "control_period_s": control_period_s,
            "flood_messages_during_trips": sent_during,
            "flood_messages_per_s": sent / flood_s if flood_s > 0 else 0.0,
            "rate_limited": status.get("rate_limited"), "server_requests": status.get("requests")}


PENDULUM = "embodyrl.envs.pendulum:make_device"


def serve_quietly(endpoint_queue, watchdog_s: float) -> None:
    """Process target: the pendulum behind a RobotServer without keys until SIGTERM; watchdog trips unlogged."""
    import logging

    from embodyrl.hal.robot_server import serve_process

    logging.getLogger("embodyrl.hal.robot_server").setLevel(logging.ERROR)  # trips are the point here
    serve_process(PENDULUM, "tcp://127.0.0.1:*", endpoint_queue, watchdog_s)


def _connect_by(endpoint: str, deadline: float, attempt_s: float):
    """A fresh actor's connect, retried (same socket, same seq) until ``deadline``: (device or None, attempts)."""
    from embodyrl.hal.drivers.remote import RemoteDevice, RemoteError, RemoteTimeout

    attempts = 0
    while time.monotonic() < deadline:
        retries = max(0, int((deadline - time.monotonic()) / attempt_s) - 1)
        device = RemoteDevice(endpoint, timeout_s=attempt_s, retries=retries, backoff=1.0)
        try:
            device.connect()
            return device, attempts + 1 + device.attempts_retried
        except RemoteTimeout:
            return None, attempts + 1 + retries
        except RemoteError:  # refused: the old session is not yet silent long enough
            attempts += 1
            time.sleep(attempt_s)
    return None, attempts


def reconnect_under_flood(quick: bool = False, flooders: int = 3, watchdog_s: float = 0.2,
                          deadline_s: float | None = None, attempt_s: float = 0.25) -> dict:
    """Seconds a restarted keyless actor takes to get its session back, quiet and while ``flooders`` flood.

    The pendulum behind a RobotServer in its own process, without keys. An
    actor connects, steps and dies without BYE (its socket closed: a new
    ZeroMQ identity next time); once its session has been silent past
    ``watchdog_s`` a restarted actor connects (HELLO to SPECS), first on a
    quiet link, then again while ``flooders`` processes (niced) send STATUS
    requests, junk and sessionless STEPs from fresh identities as fast as
    they go out. The restarted actor retries its HELLO every ``attempt_s``;
    ``None`` means it did not get in within ``deadline_s`` (default 5 s,
    ``quick`` 3 s). A scenario of ``embodyrl bench chaos``: two restarts
    injected, no rows at stake.
    """
    deadline_s = (3.0 if quick else 5.0) if deadline_s is None else deadline_s
    endpoints, report, stop_flood = CTX.Queue(), CTX.Queue(), CTX.Event()
    server = CTX.Process(target=serve_quietly, args=(endpoints, watchdog_s), daemon=True)
    server.start()
    floods, device, result = [], None, {}
    try:
        endpoint = endpoints.get(timeout=120)
        for phase in ("quiet", "flood"):
            device, _ = _connect_by(endpoint, time.monotonic() + 30, 1.0)
            if device is None:
                raise RuntimeError(f"{phase}: the first actor did not connect")
            device.reset(seed=0)
            device.step(np.zeros(device.action_spec.shape, np.float32))
            last_heard = time.monotonic()
            if phase == "flood":
                ready = [CTX.Event() for _ in range(flooders)]
                floods = [CTX.Process(target=flood, args=(endpoint, stop_flood, report, r), daemon=True)
                          for r in ready]
                for process in floods:
                    process.start()
                if not all(r.wait(120) for r in ready):
                    raise RuntimeError("the flooders did not start")
            device._drop_socket()  # the actor dies without BYE; the next one is a new ZeroMQ identity
            device = None
            time.sleep(max(0.2, last_heard + 1.5 * watchdog_s - time.monotonic()))
            start = time.monotonic()
            device, attempts = _connect_by(endpoint, start + deadline_s, attempt_s)
            result[phase] = (None if device is None else time.monotonic() - start, attempts)
            if phase == "flood":
                stop_flood.set()
                sent, seconds = zip(*(report.get(timeout=30) for _ in floods), strict=True)
            if device is None:  # locked out: get in once the flood is over, to read the counters
                device, _ = _connect_by(endpoint, time.monotonic() + 30, 1.0)
            status = device.server_status()
            device.close()
            device = None
    finally:
        stop_flood.set()
        if device is not None:
            device._drop_socket()
        for process in floods:
            _stop(process)
        server.terminate()
        _stop(server)
    (flooded, tries), (quiet, _) = result["flood"], result["quiet"]
    return {"name": "robot_reconnect_under_flood", "injected": 2, "produced": 0, "stored": 0, "lost": 0,
            "duplicated": 0, "restarted_actor_reconnect_s_under_flood": flooded,
            "restarted_actor_reconnect_s_quiet": quiet, "hello_attempts_under_flood": tries,
            "flooders": flooders, "flood_messages_per_s": sum(sent) / max(seconds),
            "rate_limited": status.get("rate_limited"), "server_requests": status.get("requests"),
            "deadline_s": deadline_s, "attempt_s": attempt_s, "watchdog_s": watchdog_s}


def restarted_actor_reconnect_s_under_flood(flooders: int = 3, deadline_s: float = 5.0) -> float | None:
    """Seconds for a restarted keyless actor to get its session back while ``flooders`` processes flood
    STATUS (None: not within ``deadline_s``); :func:`reconnect_under_flood` has the other figures."""
    return reconnect_under_flood(flooders=flooders, deadline_s=deadline_s)["restarted_actor_reconnect_s_under_flood"]
