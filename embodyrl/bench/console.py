"""``embodyrl bench console``: what the operator console costs the robot, and how fast it stops it.

A real console process (``embodyrl console``, on loopback) and, in this
process, an actor loop at 100 Hz in real time driving
``SafeDevice(MujocoDevice)``: the 7-DoF arm of the push task with its 64 x 64
top camera, random actions, no learner. No browser is involved.

* **E-stop latency** (``console_estop_ms_p95``): 50 e-stop requests posted to
  the console's HTTP API, each cleared before the next. Measured from the
  moment the console received the request (its monotonic clock, returned in
  the answer) to the moment the driver commanded its safe state (the
  driver's ``_on_estop``, same clock: one machine). Goal: under 100 ms. The
  client's whole round trip (POST to answer) is reported beside it.
* **The control loop with the camera stream on, against off**: the same loop
  in blocks of one second, the stream (10 frames a second, JPEG at the
  camera's size) on in every other block. The figure is the tick-to-tick
  period error, each tick's actual period minus the nominal 10 ms (a late
  tick counts with its whole lateness, the early one that follows with its
  earliness), as its absolute value's p99 and max, over the ticks of each
  kind of block (each block's first tick left out: it spans the switch).
  Goal: the p99 with the stream within max(10 %, 0.05 ms) of the p99
  without.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request

import numpy as np

from ..console.process import LoopThread

NOMINAL_S = 0.01


def _post(url: str, body: dict, token: str | None) -> dict:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def _actor(control: str) -> LoopThread:
    """The loop under test: SafeDevice(arm push with camera) at 100 Hz, dialling the console; every
    step's time (``step_times``) and every e-stop's time at the driver (``estopped_at``) kept."""
    from ..envs.arm_push import make_camera_device
    from ..hal.actor import ActorConfig, ActorLoop
    from ..hal.console import ConsoleLink
    from ..hal.link import NullLink
    from ..hal.policy import UniformRandomPolicy
    from ..hal.safety import SafeDevice, SafetyConfig
    from ..hal.task import Task

    driver = make_camera_device()
    estopped_at: list[float] = []
    commanded = driver._on_estop

    def timed_estop() -> None:  # the driver commands its safe state here
        commanded()
        estopped_at.append(time.monotonic())

    driver._on_estop = timed_estop
    device = SafeDevice(driver, SafetyConfig())
    step_times: list[float] = []
    step = device.step

    def timed_step(action):
        step_times.append(time.monotonic())
        return step(action)

    device.step = timed_step

    class Endless(Task):
        max_episode_steps = 200

        def reward(self, observation, action, next_observation):
            return 0.0

        def terminated(self, next_observation):
            return False

    console = ConsoleLink(control, role="actor", actor_id=0)
    scale = device.control_period_s / NOMINAL_S  # the arm's own period is 40 ms: paced at 10 ms
    loop = ActorLoop(device, Endless(), UniformRandomPolicy(device.action_spec, seed=0), NullLink(),
                     ActorConfig(realtime=True, time_scale=scale, random_steps=10**9), console=console)
    actor = LoopThread(device, loop, console)
    actor.step_times, actor.estopped_at = step_times, estopped_at
    return actor


def _estop_latency(url: str, token: str | None, actor: LoopThread, requests: int) -> dict:
    latency, roundtrip = [], []
    for _ in range(requests):
        seen = len(actor.estopped_at)
        sent = time.monotonic()
        answer = _post(f"{url}/api/action", {"action": "estop", "actor": 0, "device": 0}, token)
        roundtrip.append((time.monotonic() - sent) * 1000)
        if answer["status"] != "ok" or len(actor.estopped_at) <= seen:
            raise RuntimeError(f"an e-stop did not reach the driver: {answer}")
        latency.append((actor.estopped_at[seen] - answer["received_at"]) * 1000)
        if _post(f"{url}/api/action", {"action": "clear_estop", "actor": 0, "device": 0}, token)["status"] != "ok":
            raise RuntimeError("clear_estop failed")
        time.sleep(0.05)
    return {"console_estop_ms_p50": round(float(np.percentile(latency, 50)), 2),
            "console_estop_ms_p95": round(float(np.percentile(latency, 95)), 2),
            "console_estop_ms_max": round(float(np.max(latency)), 2),
            "console_estop_roundtrip_ms_p95": round(float(np.percentile(roundtrip, 95)), 2),
            "console_estop_requests": requests}


def _stream_timing(actor: LoopThread, blocks: int) -> dict:
    from ..hal.wire.control import StreamSettings

    errors = {True: [], False: []}
    for block in range(2 * blocks):
        streaming = block % 2 == 1
        actor.console.stream = StreamSettings(fps=10.0 if streaming else 0.0, width=160)
        start = len(actor.step_times)
        time.sleep(1.0)
        times = np.array(actor.step_times[start:])
        periods = np.diff(times)[1:]  # the block's first period spans the switch
        errors[streaming].extend(np.abs(periods - NOMINAL_S) * 1000)
    result = {}
    for streaming, name in ((True, "with_stream"), (False, "without_stream")):
        values = np.array(errors[streaming])
        for q in (50, 95, 99):
            result[f"control_period_error_p{q}_ms_{name}"] = round(float(np.percentile(values, q)), 3)
        result[f"control_period_error_max_ms_{name}"] = round(float(values.max()), 3)
        result[f"control_ticks_{name}"] = int(values.size)
        result[f"control_overruns_1ms_{name}"] = int(np.sum(values > 1.0))
    on, off = result["control_period_error_p99_ms_with_stream"], result["control_period_error_p99_ms_without_stream"]
    result["control_period_error_p99_ratio"] = round(on / off, 3) if off > 0 else None
    result["stream_goal_met"] = bool(on - off <= max(0.1 * off, 0.05))
    result["frames_sent"] = actor.console.frames_sent
    result["frames_dropped"] = actor.console.frames_dropped
    return result


def run(quick: bool = False) -> dict:
    import os

    import starlette  # noqa: F401 - here, not in the console's own process: a missing extra is named
    import uvicorn  # noqa: F401

    from ..console.process import ConsoleProcess

    with tempfile.TemporaryDirectory() as run_dir, ConsoleProcess(run_dir) as console, _actor(console.control) as actor:
        deadline = time.monotonic() + 30
        while not actor.console.connected or len(actor.step_times) < 50:
            if time.monotonic() > deadline:
                raise RuntimeError("the actor did not reach the console")
            time.sleep(0.05)
        result = {"control_rate_hz": 100, "camera": "64x64 RGB (arm push, top)", "stream_fps": 10.0}
        result.update(_estop_latency(console.url, console.token, actor, 10 if quick else 50))
        result["estop_goal_met"] = result["console_estop_ms_p95"] < 100
        result.update(_stream_timing(actor, 3 if quick else 30))
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return result
