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
          niceness: int = 19) -> None:
    """Process target: STATUS, junk and sessionless STEPs to ``endpoint`` as fast as ZeroMQ takes them.

    Every ``renew_every`` messages one socket is replaced by a fresh one (a new
    ZeroMQ identity). Sets ``ready`` once the first thousand are out; puts
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
        if i % 256 == 0 and stop.is_set():
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
    action = np.full(device.action_spec.shape, 1.0, np.float32)
    for _ in range(n):
        device.reset(seed=0)
        for _ in range(steps):
            device.step(action)
        time.sleep(silence_s)  # silent: the watchdog must stop the arm
    return n * steps


def _stop(process) -> None:
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)


def watchdog_under_flood(quick: bool = False) -> dict:
    """The watchdog's delay with and without a flood of sessionless requests (medians over trips)."""
    from embodyrl.hal.drivers.remote import RemoteDevice

    trips, steps = (3, 5) if quick else (10, 10)
    silence_s = 3 * WATCHDOG_S
    endpoints, records, report = CTX.Queue(), CTX.Queue(), CTX.Queue()
    stop_server, stop_flood, flooding = CTX.Event(), CTX.Event(), CTX.Event()
    server = CTX.Process(target=serve_recording, args=(endpoints, stop_server, records, WATCHDOG_S), daemon=True)
    server.start()
    flooder = None
    try:
        endpoint, control_period_s = endpoints.get(timeout=120)
        with RemoteDevice(endpoint, timeout_s=1.0, retries=2) as device:
            quiet_start = time.monotonic()
            produced = _trips(device, trips, steps, silence_s)
            flooder = CTX.Process(target=flood, args=(endpoint, stop_flood, report, flooding), daemon=True)
            flooder.start()
            if not flooding.wait(120):
                raise RuntimeError("the flooder did not start")
            time.sleep(0.2)
            flood_start = time.monotonic()
            produced += _trips(device, trips, steps, silence_s)
            flood_end = time.monotonic()
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
    return {"name": "robot_watchdog_under_flood", "injected": trips, "produced": produced, "stored": stored,
            "lost": max(0, produced - stored), "duplicated": max(0, stored - produced),
            "robot_watchdog_delay_ms_under_flood": 1e3 * statistics.median(flooded) if flooded else None,
            "robot_watchdog_delay_ms_under_flood_max": 1e3 * max(flooded) if flooded else None,
            "robot_watchdog_delay_ms_quiet": 1e3 * statistics.median(quiet) if quiet else None,
            "watchdog_trips_under_flood": len(flooded),
            "within_bound": len(flooded) == trips and max(flooded) <= bound_s,
            "bound_ms": 1e3 * bound_s, "watchdog_s": WATCHDOG_S, "control_period_s": control_period_s,
            "flood_messages_per_s": sent / flood_s if flood_s > 0 else 0.0,
            "rate_limited": status.get("rate_limited"), "server_requests": status.get("requests")}

