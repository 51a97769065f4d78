"""``embodyrl bench hal``: the control loop's period error, and the cost of a HAL step.

Two measurements, each against its baseline in the same run:

* **Control loop**: a :class:`RateClock` paces, at 100, 500 and 1000 Hz, the
  loop body an actor runs on a robot: a numpy-runtime policy (a
  :class:`NumpyPolicy` MLP, 2 x 256 hidden, Gaussian exploration) acting on
  ``SafeDevice(MujocoDevice).step`` of the ``arm_reach`` task's 7-DoF arm.
  The figure is the **period error**: each period's actual length (from one
  loop body's start to the next, timed by the bench itself) minus the
  nominal period, as its absolute value's p99 and max. An overrun (a body
  longer than the period: past its deadline, the clock goes on at once and
  starts a new schedule one period later, never rushing) counts with its
  whole size: a body 5 ms too long makes a +5 ms period. Beside it: the
  deadlines missed, the overruns' sizes (the clock's: each one's excess over
  the period, which is its period error; p99 and max), the body's own time
  and the rate the loop achieved. With the machine idle and with every core
  loaded by a busy-loop process (started with ``spawn``, killed afterwards);
  each condition in a fresh process, once under SCHED_FIFO
  (``set_realtime_priority``, as the actor does on hardware;
  ``realtime_priority_granted`` says if it was allowed) and once under
  normal scheduling. Each run's figures are under
  ``clock_{idle,loaded}_{R}hz_*``. Baseline: the naive loop at 500 Hz, the
  same body followed by ``time.sleep(period)``: its period error (the body
  lengthens every period) and rate error, under ``naive_*``.
* **Act time**: one exploring action of the arm's DDPG actor (2 x 256
  hidden) in the numpy runtime, on the export the learner sends an actor
  without JAX, against the JAX policy an actor with JAX uses (jitted, the
  observation padded in and the action brought back to numpy), same weights
  and observations, blocks alternating: ``act_us_numpy_mlp256``,
  ``act_us_jax_mlp256``, ``numpy_over_jax_act_time`` (medians of the blocks).
* **Step cost**: ``SafeDevice(MujocoDevice).step`` (clip, rate limit,
  validation, the driver) against ``mujoco.mj_step(model, data, nstep=10)``
  with the same control written, on the same model and data, for the 7-DoF
  arm and the pendulum (both 10 physics steps per control step). Blocks of
  steps alternate between the two; the ratio is of the median block times.

Headline keys, for each rate R in 100, 500, 1000 (the worse of idle and
loaded; misses summed): ``period_error_p99_ms_{R}hz``,
``period_error_max_ms_{R}hz``, ``missed_deadlines_{R}hz``,
``overrun_ms_p99_{R}hz`` (0 when no body overran) and
``achieved_rate_ratio_{R}hz``; ``jitter_p99_ms_500hz`` and
``jitter_max_ms_500hz`` are the 500 Hz period error's (the same values,
kept under their old names); ``naive_over_clock_period_error_p99_500hz``.
All of them again with ``_normal_priority`` appended, for normal
scheduling. ``loop_body_us_p99`` and ``loop_body_fits_1000hz`` (the body's
p99 in the idle 1000 Hz run with SCHED_FIFO asked for, below the 1 ms period: whether this
machine can run the arm at 1000 Hz at all); ``mujoco_overhead_ratio`` (arm)
and ``pendulum_overhead_ratio``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np

RATES_HZ = (100, 500, 1000)
NAIVE_HZ = 500
HIDDEN = (256, 256)
REALTIME_PRIORITY = 50
EXPLORATION_STD = 0.1
WARMUP_STEPS = 50


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


def _arm_and_policy():
    """The loop body's parts: the arm behind its safety layer, and an MLP actor in the numpy runtime."""
    from .. import envs
    from ..hal.runtime import FORMAT, FORMAT_VERSION, NumpyPolicy
    from ..hal.safety import SafeDevice, SafetyConfig

    raw, _ = envs.make("arm_reach")
    spec = raw.action_spec
    device = SafeDevice(raw, SafetyConfig(max_delta=float(np.max(spec.maximum - spec.minimum)) / 4))
    fields = [s.name for s in raw.observation_spec.specs]
    rng = np.random.default_rng(0)
    widths = [sum(s.size for s in raw.observation_spec.specs), *HIDDEN, spec.size]
    ops: list[dict] = [{"op": "concat", "fields": fields}]
    arrays: dict[str, np.ndarray] = {}
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        kernel, bias = f"actor/layers/{i}/kernel", f"actor/layers/{i}/bias"
        arrays[kernel] = (rng.normal(size=(fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        arrays[bias] = np.zeros(fan_out, np.float32)
        ops += [{"op": "dense", "kernel": kernel, "bias": bias}, {"op": "relu"}]
    ops[-1] = {"op": "tanh"}
    ops.append({"op": "scale", "center": "scale/center", "half_range": "scale/half_range"})
    arrays["scale/center"] = ((spec.maximum + spec.minimum) / 2).astype(np.float32)
    arrays["scale/half_range"] = ((spec.maximum - spec.minimum) / 2).astype(np.float32)
    graph = {"format": FORMAT, "format_version": FORMAT_VERSION, "algo": "random-mlp", "policy_version": [0, 1],
             "observation_spec": raw.observation_spec.to_msg(), "action_spec": spec.to_msg(),
             "exploration": {"kind": "gaussian", "std": EXPLORATION_STD}, "graph": ops}
    return device, NumpyPolicy(graph, arrays, seed=0)


def _period_figures(starts: np.ndarray, ends: np.ndarray, hz: int) -> dict:
    """Period error (|actual - nominal|, ms) between body starts, the body's time, the rate achieved."""
    errors = np.abs(np.diff(starts) - 1.0 / hz) * 1e3
    body_us = (ends - starts[:-1]) * 1e6
    p50, p99 = np.percentile(errors, [50, 99])
    b50, b99 = np.percentile(body_us, [50, 99])
    achieved = (starts.size - 1) / (starts[-1] - starts[0])
    return {"ticks": int(errors.size), "p50_ms": float(p50), "p99_ms": float(p99), "max_ms": float(errors.max()),
            "body_us_p50": float(b50), "body_us_p99": float(b99), "rate_ratio": float(achieved / hz)}


def _loop(hz: int, seconds: float, device, policy, paced: bool) -> dict:
    """The body ``int(hz * seconds)`` times, paced by a RateClock or by ``sleep(period)`` after it."""
    from ..hal.clock import RateClock

    n = int(hz * seconds)
    starts, ends = np.empty(n + 1), np.empty(n)
    observation = device.reset(seed=hz)
    for _ in range(WARMUP_STEPS):  # caches, allocations: not the figure
        observation = device.step(policy.act(observation)[0])
    period = 1.0 / hz
    clock = RateClock(hz) if paced else None
    starts[0] = time.perf_counter()
    for i in range(n):
        action, _ = policy.act(observation)
        observation = device.step(action)
        ends[i] = time.perf_counter()
        if clock is not None:
            clock.tick()
        else:
            time.sleep(period)
        starts[i + 1] = time.perf_counter()
    out = _period_figures(starts, ends, hz)
    if clock is not None:
        st = clock.stats()
        out.update(missed=st.missed, overruns=st.overruns, overrun_p99_ms=st.overrun_p99_ms,
                   overrun_max_ms=st.overrun_max_ms)
    return out


def _clock_child(seconds: float, priority: int, loaded: bool, queue) -> None:
    """In a fresh process: (optionally) load the cores, set the priority, time each rate and the naive loop."""
    from ..hal.clock import set_realtime_priority

    cores = os.cpu_count() or 2
    device, policy = _arm_and_policy()
    with device, _Load(cores if loaded else 0, max_s=(len(RATES_HZ) + 1) * seconds + 30):
        granted = set_realtime_priority(priority) if priority else False  # after the load started
        runs = {hz: _loop(hz, seconds, device, policy, paced=True) for hz in RATES_HZ}
        naive = _loop(NAIVE_HZ, seconds, device, policy, paced=False)
    queue.put({"granted": granted, "runs": runs, "naive": naive})


def _clock_measure(seconds: float, priority: int, loaded: bool) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_clock_child, args=(seconds, priority, loaded, queue))
    proc.start()
    try:
        return queue.get(timeout=(len(RATES_HZ) + 1) * seconds + 90)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


RUN_KEYS = ("ticks", "p50_ms", "p99_ms", "max_ms", "missed", "overruns", "overrun_p99_ms", "overrun_max_ms",
            "body_us_p50", "body_us_p99", "rate_ratio")
NAIVE_KEYS = ("ticks", "p50_ms", "p99_ms", "max_ms", "body_us_p50", "body_us_p99", "rate_ratio")


def _clock(quick: bool) -> dict:
    """Headline figures with the real-time priority the actor uses on hardware; normal too."""
    seconds = 0.3 if quick else 3.0
    conditions = ("idle", "loaded")
    out: dict = {"clock_seconds_per_run": seconds, "load_processes": os.cpu_count() or 2,
                 "policy_hidden": list(HIDDEN)}
    for priority, tag in ((REALTIME_PRIORITY, ""), (0, "_normal_priority")):
        for condition in conditions:
            result = _clock_measure(seconds, priority, condition == "loaded")
            if priority:
                out["realtime_priority_granted"] = result["granted"]
            for hz, figures in result["runs"].items():
                for key in RUN_KEYS:
                    out[f"clock_{condition}_{hz}hz_{key}{tag}"] = figures[key]
            for key in NAIVE_KEYS:
                out[f"naive_{condition}_{NAIVE_HZ}hz_{key}{tag}"] = result["naive"][key]
        for hz in RATES_HZ:
            def each(key, hz=hz, tag=tag):
                return [out[f"clock_{c}_{hz}hz_{key}{tag}"] for c in conditions]
            out[f"period_error_p99_ms_{hz}hz{tag}"] = max(each("p99_ms"))
            out[f"period_error_max_ms_{hz}hz{tag}"] = max(each("max_ms"))
            out[f"missed_deadlines_{hz}hz{tag}"] = sum(each("missed"))
            out[f"overrun_ms_p99_{hz}hz{tag}"] = max(each("overrun_p99_ms"))
            out[f"achieved_rate_ratio_{hz}hz{tag}"] = min(each("rate_ratio"))
        out[f"jitter_p99_ms_500hz{tag}"] = out[f"period_error_p99_ms_500hz{tag}"]
        out[f"jitter_max_ms_500hz{tag}"] = out[f"period_error_max_ms_500hz{tag}"]
        naive = max(out[f"naive_{c}_{NAIVE_HZ}hz_p99_ms{tag}"] for c in conditions)
        out[f"naive_sleep_period_error_p99_ms_{NAIVE_HZ}hz{tag}"] = naive
        out[f"naive_sleep_rate_error_{NAIVE_HZ}hz{tag}"] = max(
            1.0 / out[f"naive_{c}_{NAIVE_HZ}hz_rate_ratio{tag}"] - 1.0 for c in conditions)
        clock = out[f"period_error_p99_ms_{NAIVE_HZ}hz{tag}"]
        out[f"naive_over_clock_period_error_p99_{NAIVE_HZ}hz{tag}"] = naive / clock if clock > 0 else None
    out["loop_body_us_p50"] = out["clock_idle_1000hz_body_us_p50"]
    out["loop_body_us_p99"] = out["clock_idle_1000hz_body_us_p99"]
    out["loop_body_fits_1000hz"] = bool(out["loop_body_us_p99"] < 1000.0)
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


def _act_cost(quick: bool) -> dict:
    """One exploring action of the arm's DDPG actor (2 x 256): the numpy runtime on the export the learner
    sends a JAX-less actor, against the JAX policy, same weights and observations, blocks alternating."""
    import jax

    from .. import envs
    from ..algos import registry
    from ..algos.heads import over
    from ..hal import params as flat_params
    from ..hal.layout import Layout
    from ..hal.runtime import NumpyPolicy
    from ..hal.steps import PolicyVersion
    from ..learner.policy_graphs import PolicyGraphs
    from ..policy import JaxPolicy

    raw, _ = envs.make("arm_reach")
    layout = Layout.of("arm_reach", raw.observation_spec, raw.action_spec)
    algorithm = over(registry.build(registry.DEFAULT), layout)  # DDPG's deterministic actor
    assert algorithm.config.hidden_sizes == HIDDEN
    jax_policy = JaxPolicy(algorithm, layout, seed=0)
    weights = flat_params.flatten({"actor": jax.device_get(jax_policy.params)})
    export = PolicyGraphs(algorithm, layout, lambda: (PolicyVersion(1, 1), weights))(0)
    numpy_policy = NumpyPolicy(*export, seed=0)
    rng = np.random.default_rng(0)
    spec = raw.observation_spec
    observations = [{name: rng.normal(size=spec[name].shape).astype(spec[name].dtype) for name in spec}
                    for _ in range(64)]
    for policy in (jax_policy, numpy_policy):  # compile, caches
        for observation in observations[:8]:
            policy.act(observation)
    block, blocks = (20, 20) if quick else (50, 200)
    times: dict[str, list[float]] = {"numpy": [], "jax": []}
    for b in range(blocks):
        for name, policy in (("numpy", numpy_policy), ("jax", jax_policy))[:: 1 if b % 2 else -1]:
            t0 = time.perf_counter()
            for i in range(block):
                policy.act(observations[i % 64])
            times[name].append((time.perf_counter() - t0) / block)
    numpy_us, jax_us = (1e6 * float(np.median(times[name])) for name in ("numpy", "jax"))
    return {"act_us_numpy_mlp256": numpy_us, "act_us_jax_mlp256": jax_us, "numpy_over_jax_act_time": numpy_us / jax_us}


def run(quick: bool = False) -> dict:
    out: dict = _act_cost(quick)
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
