"""``embodyrl bench coupling``: what the rank-local link costs next to the model step it serves.

One rank's block of the column model (a quarter of the 64 x 32 x 70 grid,
8 latitude rows, 512 columns) steps while its :class:`CouplingLink` streams
half its columns every 8th step (a sixteenth of the column steps; one
message every 16 steps, as the NWP experiment does) to a real learner server in another
(spawned) process and runs a per-level policy replica (64 x 64). Per step we
time the model's own step (the baseline; one block, so no halo exchange), the
link's own work (checks, the step batch, sockets, weights) and the policy
inference apart, and report medians (over cycles of ``send_every x
stream_every`` exchanges, so every sample holds one send) and the ratios
``link_overhead_fraction`` and ``inference_fraction``
on the CPU clock (the rank thread's time, plus the ZeroMQ I/O threads' for the
link), with the wall-clock ratios beside them (``*_wall``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time

import numpy as np

from ..envs.columns import ColumnConfig, ColumnModel, row_split
from ..hal import runtime
from ..hal.coupling.link import CouplingConfig, CouplingLink, io_threads_cpu_s
from ..transport.server import UNSENT

SERVER_INCARNATION = 4
"""The bench learner's incarnation; the links' policy is of an earlier one of its run (3, given to the
server as such), so their rows are accepted (a row naming a version of the server's own incarnation
that it never published is refused as forged, one of an incarnation the run never had as unknown)
and no weights flow."""


def _server(queue, stop) -> None:
    """A learner server that acknowledges every batch; at the end it puts the rows it took and its
    refusals by reason on ``queue`` (a bench whose rows were refused measured something else)."""
    from ..transport.server import LearnerServer

    server = LearnerServer(run_id="bench-coupling", incarnation=SERVER_INCARNATION, incarnations=(3,))
    queue.put(server.endpoint)
    granted, rows = set(), 0
    while not stop.is_set():
        for batch in server.poll(20):
            rows += len(batch.steps)
            server.ack(batch.session, batch.seq, credits=len(batch.steps))
        for identity, session in server.sessions.items():
            if identity not in granted:
                granted.add(identity)
                server.grant(session, 1 << 30)
    queue.put({"rows": rows, "refused": dict(server.stats.rejected)})
    server.close()


@contextlib.contextmanager
def bench_learner():
    """A learner server in a spawned process: yields ``(endpoint, account)``; on leaving, ``account``
    gets the rows it took (``"rows"``), and a refused batch fails the bench (its figures would not
    be the link's)."""
    ctx = mp.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_server, args=(queue, stop), daemon=True)
    server.start()
    account: dict = {}
    try:
        yield queue.get(timeout=120), account
    finally:
        stop.set()
        try:
            account.update(queue.get(timeout=30))
        finally:
            server.join(10)
            if server.is_alive():
                server.terminate()
    refused = {k: v for k, v in account["refused"].items() if k not in UNSENT}
    if refused:
        raise RuntimeError(f"the bench learner refused batches {refused}: the figures would not be the link's")


def bench_config(grid: ColumnConfig, endpoint: str) -> CouplingConfig:
    """The NWP experiment's streaming: half the columns every 8th exchange, a message every 2 of them."""
    return CouplingConfig(levels=grid.levels, features=ColumnModel.FEATURES, context=ColumnModel.CONTEXT, radius=2,
                          max_correction=3.0, stream_fraction=0.5, stream_every=8, send_every=2, learner=endpoint,
                          connect_timeout_s=60.0, compression="off")


def _policy(cfg: CouplingConfig, hidden: int = 64) -> runtime.NumpyPolicy:
    """The coupling learner's own per-level actor, freshly initialised, as the numpy runtime runs it."""
    import jax

    from ..algos.ddpg import DDPGConfig
    from ..coupling.learner import export_policy, init
    from ..hal.steps import PolicyVersion

    config = DDPGConfig(hidden_sizes=(hidden, hidden), exploration_noise=0.1)
    networks, state = init(jax.random.key(0), cfg, config)
    return runtime.NumpyPolicy(*export_policy(networks, state.actor_params, config, PolicyVersion(3, 1)), seed=0)


def run(quick: bool = False) -> dict:
    cycles = 2 if quick else 16
    grid = ColumnConfig.model()
    rows = row_split(grid.nlat, 4)[1] if quick else range(8, 16)
    model = ColumnModel(grid, seed=1, rows=rows)
    theta = model.equilibrium(0.0)
    with bench_learner() as (endpoint, account):
        cfg = bench_config(grid, endpoint)
        link = CouplingLink(cfg, rank=1, policy=_policy(cfg), seed=0)
        cycle = cfg.send_every * cfg.stream_every
        per_cycle = {k: [] for k in ("model", "model_cpu", "link", "link_cpu", "inference", "inference_cpu")}
        io_start = io_threads_cpu_s()
        for _ in range(cycles):  # one cycle: the exchanges of one batch (the next cycle's first sends it)
            s0 = (link.stats.link_s, link.stats.link_cpu_s, link.stats.inference_s, link.stats.inference_cpu_s)
            model_s = model_cpu = 0.0
            for _ in range(cycle):
                state, context = model.features(theta), model.context(theta)
                target = np.zeros((len(model.columns), grid.levels))
                correction = link.exchange(state, {"context": context, "target": target})
                t0, c0 = time.perf_counter(), time.thread_time()
                theta, _ = model.step(theta, correction=correction / 86400.0)
                model_s, model_cpu = model_s + time.perf_counter() - t0, model_cpu + time.thread_time() - c0
            s1 = (link.stats.link_s, link.stats.link_cpu_s, link.stats.inference_s, link.stats.inference_cpu_s)
            for key, value in zip(("link", "link_cpu", "inference", "inference_cpu"),
                                  np.subtract(s1, s0), strict=True):
                per_cycle[key].append(value / cycle)
            per_cycle["model"].append(model_s / cycle)
            per_cycle["model_cpu"].append(model_cpu / cycle)
        io_s = None if io_start is None else (io_threads_cpu_s() - io_start) / (cycles * cycle)
        link.close(flush_s=10.0)
        sent, zero = link.stats.steps_sent, link.stats.zero_answers
    ms = {k: 1e3 * float(np.median(v)) for k, v in per_cycle.items()}
    link_cpu_ms = ms["link_cpu"] + 1e3 * (io_s or 0.0)
    return {"columns": len(model.columns), "levels": grid.levels, "steps": cycles * cycle,
            "model_step_ms": ms["model"], "link_ms": ms["link"], "inference_ms": ms["inference"],
            "model_step_cpu_ms": ms["model_cpu"], "link_cpu_ms": link_cpu_ms,
            "link_io_threads_cpu_ms": None if io_s is None else 1e3 * io_s,
            "inference_cpu_ms": ms["inference_cpu"],
            "link_overhead_fraction": link_cpu_ms / ms["model_cpu"],
            "link_overhead_fraction_cpu": link_cpu_ms / ms["model_cpu"],
            "link_overhead_fraction_wall": ms["link"] / ms["model"],
            "inference_fraction": ms["inference_cpu"] / ms["model_cpu"],
            "inference_fraction_wall": ms["inference"] / ms["model"],
            "us_per_column_step": {"physics": 1e3 * ms["model_cpu"] / len(model.columns),
                                   "link": 1e3 * link_cpu_ms / len(model.columns),
                                   "inference": 1e3 * ms["inference_cpu"] / len(model.columns),
                                   "inference_network": "per-level MLP 21-64-64-1 (ReLU, tanh), at each of "
                                                        f"{grid.levels} levels"},
            "steps_sent": sent, "steps_acknowledged": account["rows"], "zero_answers": zero,
            "stream_fraction": cfg.stream_fraction,
            "stream_every": cfg.stream_every,
            "clock": "fractions on the CPU clock (the rank thread's, plus the ZeroMQ I/O threads' for the link; "
                     "the process's for inference); *_wall on wall clocks; medians over cycles of send_every x "
                     "stream_every exchanges, so the exchange that sends the batch is in every sample",
            "baseline": "the model's own step for the same columns (physics, mixing, convection)"}
