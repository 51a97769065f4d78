"""``embodyrl bench hal``: control-loop timing and the cost of a HAL step.

Two measurements, each against its baseline in the same run:

* **Clock**: a :class:`RateClock` loop at 100, 500 and 1000 Hz running a
  trivial numpy policy, with the machine idle and with every core loaded by
  a busy-loop process (started with ``spawn``, killed afterwards): p50 / p99
  / max lateness and every missed deadline. Each condition runs in a fresh
  process, once under SCHED_FIFO (``set_realtime_priority``, as the actor
  does on hardware; ``realtime_priority_granted`` says if it was allowed)
  and once under normal scheduling (keys ending ``_normal_priority``).
  Baseline: the naive loop (``time.sleep(period)`` after the body), whose
  rate error is reported.
* **Step cost**: ``SafeDevice(MujocoDevice).step`` (clip, rate limit,
  validation, the driver) against ``mujoco.mj_step(model, data, nstep=10)``
  with the same control written, on the same model and data, for the 7-DoF
  arm and the pendulum (both 10 physics steps per control step). Blocks of
  steps alternate between the two; the ratio is of the median block times.

Headline keys: ``jitter_p99_ms_500hz`` and ``missed_deadlines_500hz`` (the
worse of idle and loaded, and the sum of their misses), ``mujoco_overhead_ratio``
(arm) and ``pendulum_overhead_ratio``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np

RATES_HZ = (100, 500, 1000)
REALTIME_PRIORITY = 50


def _busy(seconds: float) -> None:
    """A busy loop that burns one core (the load in the loaded runs), at normal priority."""
    if hasattr(os, "sched_setscheduler"):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


class _Load:
    """``n`` busy-loop processes for the duration of a ``with`` block."""

    def __init__(self, n: int, max_s: float):
        self.n, self.max_s = n, max_s
        self.procs: list = []

    def __enter__(self):
        ctx = mp.get_context("spawn")
        self.procs = [ctx.Process(target=_busy, args=(self.max_s,), daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        if self.procs:
            time.sleep(0.5)  # let them start spinning (a spawn imports the package)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.join(5)


def _clock_run(hz: int, seconds: float) -> dict:
    from ..hal.clock import RateClock

    rng = np.random.default_rng(0)
    weights = rng.normal(size=(7, 14)).astype(np.float32)
    observation = rng.normal(size=14).astype(np.float32)
    clock = RateClock(hz)
    for _ in range(int(hz * seconds)):
        action = np.tanh(weights @ observation)  # the trivial policy
        observation[:7] = action
        clock.tick()
    return clock.stats().to_dict()


def _naive_rate_error(hz: int, seconds: float) -> float:
    """Relative rate error of ``sleep(period)`` after the body (it drifts)."""
    period = 1.0 / hz
    n = int(hz * seconds)
    start = time.perf_counter()
    for _ in range(n):
        np.tanh(np.ones(7))
        time.sleep(period)
    achieved = n / (time.perf_counter() - start)
    return float(hz / achieved - 1.0)


def _clock_child(seconds: float, priority: int, loaded: bool, queue) -> None:
    """In a fresh process: (optionally) load the cores, set the priority, time each rate."""
    from ..hal.clock import set_realtime_priority

    cores = os.cpu_count() or 2
    with _Load(cores if loaded else 0, max_s=len(RATES_HZ) * seconds + 30):
        granted = set_realtime_priority(priority) if priority else False  # after the load started
        runs = {hz: _clock_run(hz, seconds) for hz in RATES_HZ}
    queue.put({"granted": granted, "runs": runs})


def _clock_measure(seconds: float, priority: int, loaded: bool) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_clock_child, args=(seconds, priority, loaded, queue))
    proc.start()
    try:
        return queue.get(timeout=len(RATES_HZ) * seconds + 60)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def _clock(quick: bool) -> dict:
    """Headline figures with the real-time priority the actor uses on hardware; normal too."""
    seconds = 0.3 if quick else 3.0
    out: dict = {"clock_seconds_per_run": seconds, "load_processes": os.cpu_count() or 2}
    for priority, tag in ((REALTIME_PRIORITY, ""), (0, "_normal_priority")):
        for condition in ("idle", "loaded"):
            result = _clock_measure(seconds, priority, condition == "loaded")
            if priority:
                out["realtime_priority_granted"] = result["granted"]
            for hz, st in result["runs"].items():
                for key in ("p50_ms", "p99_ms", "max_ms", "missed", "ticks"):
                    out[f"clock_{condition}_{hz}hz_{key}{tag}"] = st[key]
        worst = [out[f"clock_{c}_500hz_p99_ms{tag}"] for c in ("idle", "loaded")]
        out[f"jitter_p99_ms_500hz{tag}"] = max(worst)
        out[f"jitter_max_ms_500hz{tag}"] = max(out[f"clock_{c}_500hz_max_ms{tag}"] for c in ("idle", "loaded"))
        out[f"missed_deadlines_500hz{tag}"] = sum(out[f"clock_{c}_500hz_missed{tag}"] for c in ("idle", "loaded"))
    out["naive_sleep_rate_error_500hz"] = _naive_rate_error(500, seconds)
    return out


def _step_cost(task: str, quick: bool) -> dict:
    import mujoco

    from .. import envs
    from ..hal.safety import SafeDevice, SafetyConfig

    raw, _ = envs.make(task)
    spec = raw.action_spec
    device = SafeDevice(raw, SafetyConfig(max_delta=float(np.max(spec.maximum - spec.minimum)) / 4))
    model, data = raw.model, raw.data
    rng = np.random.default_rng(0)
    actions = rng.uniform(spec.minimum, spec.maximum, (64, spec.size)).astype(spec.dtype)
    block, blocks = (20, 20) if quick else (50, 400)
    hal, baseline = [], []
    with device:
        for b in range(blocks):
            if b % 10 == 0:
                device.reset(seed=b)
            t0 = time.perf_counter()
            for i in range(block):
                device.step(actions[i % 64])
            t1 = time.perf_counter()
            for i in range(block):
                data.ctrl[:] = actions[i % 64]
                mujoco.mj_step(model, data, nstep=raw.control_substeps)
            t2 = time.perf_counter()
            hal.append((t1 - t0) / block)
            baseline.append((t2 - t1) / block)
        interventions = dict(device.interventions)
    hal_us, raw_us = 1e6 * float(np.median(hal)), 1e6 * float(np.median(baseline))
    return {"hal_step_us": hal_us, "raw_mj_step_us": raw_us, "ratio": hal_us / raw_us,
            "physics_steps": raw.control_substeps, "rate_limited": interventions["rate_limited"]}


def run(quick: bool = False) -> dict:
    out: dict = {}
    arm = _step_cost("arm_reach", quick)
    pendulum = _step_cost("pendulum", quick)
    out["mujoco_overhead_ratio"] = arm["ratio"]
    out["pendulum_overhead_ratio"] = pendulum["ratio"]
    for name, figures in (("arm", arm), ("pendulum", pendulum)):
        for key, value in figures.items():
            if key != "ratio":
                out[f"{name}_{key}"] = value
    out.update(_clock(quick))
    return out
