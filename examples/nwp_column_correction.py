"""Learnt corrections for a column "weather model" across MPI ranks: nudged training, free forecasts.

::

    python examples/nwp_column_correction.py --out runs/nwp            # 4 ranks, a few minutes
    python examples/nwp_column_correction.py --out /tmp/nwp --quick     # a small grid, under a minute
    mpiexec -n N python examples/nwp_column_correction.py rank ARGS.json   # one rank (run() starts them)

This script starts a learner process (per-level DDPG, :mod:`embodyrl.coupling`)
and ``--ranks`` MPI ranks of the column model (``mpiexec -n N python examples/nwp_column_correction.py rank
ARGS.json``: :func:`rank_main`, with the phases of :mod:`embodyrl.coupling.nwp`). Each rank streams
its own column steps to the learner and takes its weights itself. When the
ranks are done it writes ``DIR/results.json`` (MAE of Z500 and T850 against
the analysis per latitude band, at +6 h and under ``by_lead`` at the other
lead times, for the native model, the constant bias correction and the
learnt policy; ``stable``; the link's overhead) and ``DIR/nwp_column_correction.png``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from embodyrl.coupling.nwp import (
    BAND_NAMES,
    VARIANTS,
    Analysis,
    ExperimentConfig,
    Rank,
    forecast_errors,
    free_run,
    make_analysis,
    new_timing,
    train,
)
from embodyrl.hal import runtime
from embodyrl.hal.coupling import CouplingConfig, CouplingLink, io_threads_cpu_s


def mpiexec() -> str:
    found = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if found is None:
        sys.exit("mpiexec not found: pip install 'embodyrl[mpi]' (mpi4py and the mpich wheel)")
    return found


def rank_main(args_path: str) -> None:
    """One MPI rank's whole experiment: analysis, nudged training, forecasts, a free run."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    args = json.loads(Path(args_path).read_text())
    exp = ExperimentConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in args["experiment"].items()})
    out = Path(args["out"])
    rank = Rank(exp, comm)
    t_start = time.perf_counter()
    make_analysis(rank, out / "analysis.npy")
    analysis = Analysis(rank, out / "analysis.npy")
    t_analysis = time.perf_counter()

    coupling = exp.coupling()
    rank.timing = new_timing()
    train_link = CouplingLink(CouplingConfig(**{**asdict(coupling), "learner": args["learner"],
                                                "connect_timeout_s": 60.0, "peer_timeout_s": 60.0}),
                              comm.rank, runtime.load(out / "policy_init", seed=comm.rank), seed=comm.rank)
    io_before = io_threads_cpu_s()
    bias = train(rank, analysis, train_link)
    io_after = io_threads_cpu_s()
    train_stats, train_timing = asdict(train_link.stats), dict(rank.timing)
    train_stats["io_threads_cpu_s"] = None if io_before is None else io_after - io_before
    train_stats["codec"] = train_link.codec
    train_link.close(flush_s=30.0)
    comm.Barrier()
    if comm.rank == 0:
        (out / "training_done").write_text("done\n")
    t_train = time.perf_counter()

    rank.timing = new_timing()
    baseline, weights = forecast_errors(rank, analysis, bias, None, ("native", "bias_corrected"))
    deadline = time.monotonic() + exp.policy_wait_s
    while not (out / "policy.npz").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    link = None
    if comm.bcast((out / "policy.npz").exists(), root=0):  # every rank takes the same branch
        link = CouplingLink(CouplingConfig(**{**asdict(coupling), "explore": False}), comm.rank,
                            runtime.load(out / "policy"))
    learnt, _ = (forecast_errors(rank, analysis, bias, link, ("corrected",)) if link is not None
                 else (np.zeros_like(baseline), None))
    sums = baseline + learnt
    stability = free_run(rank, analysis, link) if link is not None else {"finite": False}
    t_eval = time.perf_counter()

    report = {"rank": comm.rank, "columns": len(rank.rows) * exp.nlon, "train_timing": train_timing,
              "train_link": {k: train_stats[k] for k in (
                  "link_s", "link_cpu_s", "inference_s", "inference_cpu_s", "io_threads_cpu_s", "exchanges",
                  "steps_sent", "zero_answers", "weights_taken", "codec")},
              "eval_timing": dict(rank.timing),
              "eval_link": None if link is None else {k: getattr(link.stats, k) for k in (
                  "link_s", "link_cpu_s", "inference_s", "inference_cpu_s")},
              "stability": {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in stability.items()},
              "wall_s": {"analysis": t_analysis - t_start, "train": t_train - t_analysis, "eval": t_eval - t_train}}
    reports = comm.gather(report, root=0)
    total = np.zeros_like(sums)
    comm.Reduce(sums, total, op=MPI.SUM, root=0)
    total_w = np.zeros_like(weights)
    comm.Reduce(weights, total_w, op=MPI.SUM, root=0)
    if comm.rank == 0:
        np.save(out / "band_error_sums.npy", total)
        np.save(out / "band_weights.npy", total_w)
        (out / "ranks.json").write_text(json.dumps(reports, indent=1) + "\n")


def learner_main(coupling: dict, out: str, endpoint_queue, min_updates: int, max_s: float) -> None:
    """The learner process: serve the ranks until training is done and ``min_updates`` are made,
    then write the final export ``policy`` (and ``learner.json``)."""
    from embodyrl.coupling import CouplingLearner

    out_dir = Path(out)
    learner = CouplingLearner(CouplingConfig(**coupling))
    learner.warm_up()
    runtime.save(out_dir / "policy_init", *learner.export())
    endpoint_queue.put(learner.endpoint)
    start = time.monotonic()
    while time.monotonic() - start < max_s:
        learner.poll(0 if learner.size >= learner.config.min_steps else 20)
        learner.train()
        if (out_dir / "training_done").exists() and learner.updates >= min_updates:
            learner.poll(0)
            break
    learner.publish()
    graph, arrays = learner.export()
    json_path, npz_path = runtime.save(out_dir / "policy_partial", graph, arrays)
    json_path.replace(out_dir / "policy.json")
    npz_path.replace(out_dir / "policy.npz")  # last: ranks wait for this file
    (out_dir / "learner.json").write_text(json.dumps({
        "updates": learner.updates, "published": learner.published, "column_steps": learner.size,
        "steps_by_rank": {str(k): v for k, v in sorted(learner.steps_by_rank.items())},
        "metrics": learner.metrics, "wall_s": time.monotonic() - start,
        "discount": learner.config.ddpg.discount, "batch_columns": learner.config.ddpg.batch_size}, indent=1) + "\n")
    learner.close()


def run(out: Path, ranks: int, exp: ExperimentConfig, min_updates: int, timeout_s: float) -> None:
    """Start the learner and the ranks; wait (bounded) for both."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    learner = ctx.Process(target=learner_main, args=(asdict(exp.coupling()), str(out), queue, min_updates,
                                                     timeout_s), daemon=True)
    learner.start()
    try:
        endpoint = queue.get(timeout=180)
        args = out / "rank_args.json"
        args.write_text(json.dumps({"experiment": asdict(exp), "out": str(out), "learner": endpoint}))
        env = dict(os.environ)
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, "1")  # one thread per rank, as MPI models run (unless the user says otherwise)
        with open(out / "ranks.log", "w") as log:
            subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, __file__, "rank", str(args)],
                           stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=True, env=env)
        learner.join(timeout=60)
    finally:
        if learner.is_alive():
            learner.terminate()
            learner.join(10)


def results(out: Path, ranks: int, exp: ExperimentConfig) -> dict:
    sums, weights = np.load(out / "band_error_sums.npy"), np.load(out / "band_weights.npy")
    n = len(exp.eval_starts_days)
    mae = sums / (weights * n)  # [variants, leads, (z500, t850), bands]
    area = sums.sum(-1) / (weights.sum() * n)  # area-weighted over the globe

    def table(lead: int) -> list[dict]:
        rows = []
        for b, name in enumerate(BAND_NAMES):
            row = {"band": name}
            for v, variant in enumerate(VARIANTS):
                prefix = "corrected" if variant == "corrected" else variant
                row[f"{prefix}_mae_z500"] = float(mae[v, lead, 0, b])
                row[f"{prefix}_mae_t850"] = float(mae[v, lead, 1, b])
            rows.append(row)
        return rows

    def mean(lead: int) -> dict:
        return {f"{variant}_mae_{var}": float(area[v, lead, j]) for v, variant in enumerate(VARIANTS)
                for j, var in enumerate(("z500", "t850"))}

    reports = json.loads((out / "ranks.json").read_text())
    learner = json.loads((out / "learner.json").read_text())
    stab = [r["stability"] for r in reports]
    z0 = np.sum([s.get("z500_sum_start", np.zeros(6)) for s in stab], 0) / weights
    z1 = np.sum([s.get("z500_sum_end", np.full(6, np.nan)) for s in stab], 0) / weights
    drift = np.abs(z1 - z0)
    largest = max(s.get("largest_correction", np.inf) for s in stab)
    stable = bool(all(s["finite"] for s in stab) and largest <= exp.max_correction + 1e-4
                  and np.isfinite(drift).all() and drift.max() < 300.0)
    native, learnt = mae[0, 0, 0], mae[2, 0, 0]
    return {
        "bands": table(0),
        "lead_hours": list(exp.lead_hours),
        "by_lead": [{"lead_hours": h, "bands": table(i), "area_weighted": mean(i)}
                    for i, h in enumerate(exp.lead_hours)],
        "area_weighted": mean(0),
        "stable": stable,
        "stability": {"free_run_days": exp.free_run_days, "largest_correction_kday": largest,
                      "bound_kday": exp.max_correction, "z500_band_drift_m": drift.tolist()},
        **overheads(reports),
        "ranks": ranks,
        "columns_by_rank": [r["columns"] for r in reports],
        "goals": {"bands_learnt_below_native_z500": int(np.sum(learnt < native)),
                  "learnt_below_bias_area_mean_z500": bool(area[2, 0, 0] < area[1, 0, 0])},
        "learner": learner,
        "wall_s": reports[0]["wall_s"],
        "experiment": asdict(exp),
        "note": "timings from a shared 2-core machine (ranks and learner oversubscribe it); fractions are sums "
                "over ranks in the training phase of the link's (or inference's) time over the model's own step "
                "time. link_overhead_fraction is on the CPU clock: the rank thread's CPU time in the link plus "
                "its ZeroMQ I/O threads', over the rank thread's CPU time in the model step less the CPU it "
                "spent waiting for halos (MPICH spins there while a neighbour is descheduled); "
                "link_overhead_fraction_cpu keeps the halo waits in the step; *_wall on wall clocks (a rank "
                "descheduled inside exchange books the wait as link time)",
    }


def overheads(reports: list[dict]) -> dict:
    """The link's and the policy's cost next to the model step, training phase, on both clocks."""
    def total(phase: str, key: str) -> float:
        return sum((r[phase] or {}).get(key) or 0.0 for r in reports)

    model_s, model_cpu = total("train_timing", "model_s"), total("train_timing", "model_cpu_s")
    halo_cpu = total("train_timing", "halo_wait_cpu_s")
    link_cpu = total("train_link", "link_cpu_s") + total("train_link", "io_threads_cpu_s")
    physics_cpu = model_cpu - halo_cpu
    return {
        "link_overhead_fraction": link_cpu / physics_cpu,
        "link_overhead_fraction_cpu_without_halo_wait": link_cpu / physics_cpu,
        "link_overhead_fraction_cpu": link_cpu / model_cpu,
        "link_overhead_fraction_wall": total("train_link", "link_s") / model_s,
        "link_overhead_clock": "cpu; the model step without its halo waits (MPICH spins while a neighbour is "
                               "descheduled); the strictest of the three",
        "inference_fraction": total("train_link", "inference_cpu_s") / physics_cpu,
        "inference_fraction_wall": total("train_link", "inference_s") / model_s,
        "feature_fraction": total("train_timing", "feature_cpu_s") / physics_cpu,
        "eval_link_overhead_fraction": total("eval_link", "link_cpu_s") / (
            total("eval_timing", "model_cpu_s") - total("eval_timing", "halo_wait_cpu_s")),
        "eval_link_overhead_fraction_wall": total("eval_link", "link_s") / total("eval_timing", "model_s"),
        "timing_s": {"train_model_wall": model_s, "train_model_cpu": model_cpu, "train_halo_wait_cpu": halo_cpu,
                     "train_halo_wait_wall": total("train_timing", "halo_wait_s"),
                     "train_link_wall": total("train_link", "link_s"),
                     "train_link_cpu_rank_threads": total("train_link", "link_cpu_s"),
                     "train_link_cpu_io_threads": total("train_link", "io_threads_cpu_s"),
                     "train_inference_wall": total("train_link", "inference_s"),
                     "train_inference_cpu": total("train_link", "inference_cpu_s"),
                     "train_exchanges": total("train_link", "exchanges")},
    }


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(res["bands"]))
    for i, (key, label) in enumerate([("native", "native"), ("bias_corrected", "constant bias correction"),
                                      ("corrected", "learnt (DDPG, per level)")]):
        ax1.bar(x + (i - 1) * 0.27, [b[f"{key}_mae_z500"] for b in res["bands"]], 0.27, label=label)
        ax2.plot(res["lead_hours"], [d["area_weighted"][f"{key}_mae_z500"] for d in res["by_lead"]], "o-",
                 label=label)
    ax1.set_xticks(x, [b["band"] for b in res["bands"]])
    ax1.set_ylabel("Z500 MAE at +6 h (m)")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("lead time (h)")
    ax2.set_ylabel("area-weighted Z500 MAE (m)")
    ax2.set_title(f"{res['ranks']} MPI ranks, stable={res['stable']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--ranks", type=int, default=4, help="MPI ranks of the model")
    parser.add_argument("--quick", action="store_true", help="a small grid and short periods (tests)")
    parser.add_argument("--min-updates", type=int, default=None, help="learner updates before the policy freezes")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="bound on the whole run")
    parser.add_argument("--keep-analysis", action="store_true", help="keep DIR/analysis.npy")
    args = parser.parse_args(argv)
    exp = ExperimentConfig.quick() if args.quick else ExperimentConfig()
    if not 1 <= args.ranks <= exp.nlat:
        parser.error(f"--ranks must be between 1 and {exp.nlat} (one latitude row per rank at least)")
    min_updates = args.min_updates if args.min_updates is not None else (200 if args.quick else 8000)
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in ("training_done", "policy.npz", "policy.json"):
        (args.out / stale).unlink(missing_ok=True)
    start = time.monotonic()
    run(args.out, args.ranks, exp, min_updates, args.timeout_s)
    res = results(args.out, args.ranks, exp)
    res["total_wall_s"] = time.monotonic() - start
    (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, args.out / "nwp_column_correction.png")
    if not args.keep_analysis:
        (args.out / "analysis.npy").unlink(missing_ok=True)
    print(f"{'band':>9} {'native':>8} {'bias':>8} {'learnt':>8}   Z500 MAE (m) at +6 h")
    for b in res["bands"]:
        print(f"{b['band']:>9} {b['native_mae_z500']:8.2f} {b['bias_corrected_mae_z500']:8.2f} "
              f"{b['corrected_mae_z500']:8.2f}")
    a = res["area_weighted"]
    print(f"{'mean':>9} {a['native_mae_z500']:8.2f} {a['bias_corrected_mae_z500']:8.2f} {a['corrected_mae_z500']:8.2f}")
    print(f"stable={res['stable']} link_overhead_fraction={res['link_overhead_fraction']:.4f} (CPU, model step "
          f"without halo waits; with them {res['link_overhead_fraction_cpu']:.4f}; wall clock "
          f"{res['link_overhead_fraction_wall']:.4f}) "
          f"inference_fraction={res['inference_fraction']:.3f} wall={res['total_wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["rank"]:  # one MPI rank, started by run() under mpiexec
        rank_main(sys.argv[2])
    else:
        sys.exit(main())
