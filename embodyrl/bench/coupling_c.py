"""``embodyrl bench coupling_c``: the link's CPU per column-step in C (libembodyrl_link) against the
Python link, on the same columns, the same settings and the same learner server, in one run.

One rank's block of the column model (512 columns x 70 levels, 5 features, 2 context values):
``records`` of its states are recorded first and written to a file; then the Python
:class:`CouplingLink` and the C example rank (``examples/c/coupling_link.c`` on the library) each
run the same exchanges over them, in turns (Python, C, Python, C, ...), streaming half the
columns every 8th exchange, one message every 2 streaming exchanges (the NWP experiment's
setting), to one real learner server in a spawned process, and computing the same 21-64-64-1
per-level policy. ``link`` is the calling thread's CPU in the link's own work (checks, the step
batch, sockets, weights; inference excluded) plus the process's ZeroMQ I/O threads' CPU, per
column-step; ``inference`` the forward pass's on the process clock, per column-step (numpy's
OpenBLAS against the system's CBLAS, one thread for the C rank). Medians over the turns; ``python_over_c_link`` is the ratio the user pays for Python.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..envs.columns import ColumnConfig, ColumnModel, row_split
from ..hal import runtime
from ..hal.coupling.clib import build, compile_program
from ..hal.coupling.link import CouplingConfig, CouplingLink, io_threads_cpu_s
from .coupling import _policy, bench_config, bench_learner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "c" / "coupling_link.c"


def _c_rank(build_dir: Path) -> Path:
    if not EXAMPLE.exists():
        raise FileNotFoundError(f"{EXAMPLE}: the C example rank is in the repository's examples/c")
    return compile_program(EXAMPLE, build_dir, build_dir / "coupling_link")


def run(quick: bool = False) -> dict:
    turns, records = (2, 4) if quick else (4, 16)
    exchanges = 32 if quick else 256
    grid = ColumnConfig.model()
    rows = row_split(grid.nlat, 4)[1] if quick else range(8, 16)
    model = ColumnModel(grid, seed=1, rows=rows)
    theta = model.equilibrium(0.0)
    data = []
    for _ in range(records):  # the model's own states, as a rank hands them over
        data.append((model.features(theta).astype(np.float32), model.context(theta).astype(np.float32),
                     np.zeros((len(model.columns), grid.levels), np.float32)))
        for _ in range(4):
            theta, _ = model.step(theta)
    columns = len(model.columns)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        binary = _c_rank(build(tmp / "build", fortran=False))
        np.concatenate([a.ravel() for r in data for a in r]).astype("<f4").tofile(tmp / "in.f32")
        with bench_learner() as (endpoint, account):
            cfg = bench_config(grid, endpoint)
            policy = _policy(cfg)
            runtime.save(tmp / "policy", policy.graph, policy.arrays, packed=True)
            c_config = (f"levels={cfg.levels} features={cfg.features} context={cfg.context} radius={cfg.radius} "
                        f"max_correction={cfg.max_correction} stream_fraction={cfg.stream_fraction} "
                        f"stream_every={cfg.stream_every} send_every={cfg.send_every} learner={endpoint} "
                        f"policy={tmp / 'policy.msgpack'} connect_timeout_s=60 seed=1")
            python, c = [], []
            for turn in range(turns):
                python.append(_python_turn(cfg, policy, data, exchanges, turn))
                c.append(_c_turn(binary, c_config, turn, columns, exchanges, tmp))
    steps = columns * exchanges

    def per_step(runs, key):
        return 1e6 * statistics.median(r[key] for r in runs) / steps

    result = {"columns": columns, "levels": grid.levels, "exchanges": exchanges, "turns": turns,
              "python_link_us_per_column_step": per_step(python, "link_cpu_s"),
              "c_link_us_per_column_step": per_step(c, "link_cpu_s"),
              "python_inference_us_per_column_step": per_step(python, "inference_cpu_s"),
              "c_inference_us_per_column_step": per_step(c, "inference_cpu_s"),
              "python_steps_sent": python[-1]["steps_sent"], "c_steps_sent": c[-1]["steps_sent"],
              "steps_acknowledged": account["rows"],
              "zero_answers": sum(r["zero_answers"] for r in python + c),
              "stream_fraction": cfg.stream_fraction, "stream_every": cfg.stream_every, "send_every": cfg.send_every,
              "inference_network": f"per-level MLP 21-64-64-1 (ReLU, tanh) at each of {grid.levels} levels",
              "clock": "CPU: the calling thread's in the link (inference excluded) plus the ZeroMQ I/O threads'; "
                       "medians over turns that alternate Python and C",
              "baseline": "the Python CouplingLink on the same records, settings and learner"}
    result["python_over_c_link"] = result["python_link_us_per_column_step"] / result["c_link_us_per_column_step"]
    result["python_over_c_inference"] = (result["python_inference_us_per_column_step"]
                                         / result["c_inference_us_per_column_step"])
    return result


def _python_turn(cfg: CouplingConfig, policy, data, exchanges: int, turn: int) -> dict:
    link = CouplingLink(cfg, rank=2 * turn, policy=runtime.NumpyPolicy(policy.graph, policy.arrays, seed=turn),
                        seed=turn)
    io_start = io_threads_cpu_s()
    for t in range(exchanges):
        state, context, target = data[t % len(data)]
        link.exchange(state, {"context": context, "target": target})
    link.close(flush_s=10.0)  # as the C rank's flush: the last batch out, every ACK in
    io = io_threads_cpu_s()
    cpu = link.stats.link_cpu_s + (io - io_start if io is not None and io_start is not None else 0.0)
    return {"link_cpu_s": cpu, "inference_cpu_s": link.stats.inference_cpu_s, "steps_sent": link.stats.steps_sent,
            "zero_answers": link.stats.zero_answers}


def _c_turn(binary: Path, config: str, turn: int, columns: int, exchanges: int, tmp: Path) -> dict:
    out = subprocess.run([str(binary), f"{config} rank={2 * turn + 1}", str(columns), str(exchanges),
                          str(tmp / "in.f32"), str(tmp / "out.f32")], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})  # one thread per rank
    if out.returncode != 0:
        raise RuntimeError(f"the C rank failed: {out.stderr[-2000:]}")
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    io = stats["io_threads_cpu_s"]
    return {"link_cpu_s": stats["link_cpu_s"] + max(io, 0.0), "inference_cpu_s": stats["inference_cpu_s"],
            "steps_sent": stats["steps_sent"], "zero_answers": stats["zero_answers"]}

