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
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from embodyrl.coupling.nwp import (
    BAND_NAMES,
    CLIMATE_BINS,
    DEFAULT_VARIANT,
    FIELDS,
    QUICK,
    VARIANTS,
    Analysis,
    ExperimentConfig,
    Rank,
    climate_run,
    climate_statistics,
    forecast_errors,
    free_run,
    goals,
    make_analysis,
    new_timing,
    train,
    train_free,
)
from embodyrl.envs.columns import DAY_S, TESTBEDS, ColumnConfig
from embodyrl.hal import runtime
from embodyrl.hal.coupling import CouplingConfig, CouplingLink, io_threads_cpu_s


def mpiexec() -> str:
    found = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if found is None:
        sys.exit("mpiexec not found: pip install 'embodyrl[mpi]' (mpi4py and the mpich wheel)")
    return found


def stem(member: str) -> str:
    """A forecast system's name as a file stem (``rl_free/s1`` -> ``rl_free-s1``)."""
    return member.replace("/", "-")


def wait_for(path: Path, seconds: float, comm) -> bool:
    """Wait up to ``seconds`` for ``path``; every rank learns rank 0's answer (same branch). Every rank
    sleeps on the file itself: a rank blocked in a collective would spin (MPICH polls), taking the CPU
    the learners need to write the file."""
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return comm.bcast(path.exists(), root=0)


def training_link(coupling: CouplingConfig, endpoint: str, out: Path, member: str, rank: int) -> CouplingLink:
    config = CouplingConfig(**{**asdict(coupling), "learner": endpoint, "connect_timeout_s": 60.0,
                               "peer_timeout_s": 60.0})
    return CouplingLink(config, rank, runtime.load(out / f"policy_init_{stem(member)}", seed=rank), seed=rank)


def link_report(links: list[CouplingLink], io_cpu_s: float | None) -> dict:
    """The phase's link costs summed over its links (one per learner)."""
    total = {k: sum(getattr(link.stats, k) for link in links) for k in (
        "link_s", "link_cpu_s", "inference_s", "inference_cpu_s", "exchanges", "steps_sent", "zero_answers",
        "weights_taken")}
    return {**total, "links": len(links), "io_threads_cpu_s": io_cpu_s, "codec": links[0].codec if links else None}


def rank_main(args_path: str) -> None:
    """One MPI rank's whole experiment: analysis, both trainings, forecasts of every system, a free run.

    ``ARGS.json``'s ``plan`` (:func:`plan_of`) names the phases still to run; the others' outputs are
    read back (this rank's constant bias, its report, each forecast system's sums)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    args = json.loads(Path(args_path).read_text())
    exp = config_of(args["experiment"])
    out, endpoints = Path(args["out"]), args["learners"]
    plan = args.get("plan") or everything(exp)
    rank = Rank(exp, comm)
    saved = out / "reports" / f"rank{comm.rank}.json"
    report = json.loads(saved.read_text()) if saved.exists() else {}
    report.update(rank=comm.rank, columns=len(rank.rows) * exp.nlon)
    report.setdefault("wall_s", {})
    clock = time.perf_counter()

    def done(name: str) -> None:
        """This rank's report saved; once every rank is here, rank 0 marks ``name`` done."""
        nonlocal clock
        report["wall_s"][name] = time.perf_counter() - clock
        saved.parent.mkdir(exist_ok=True)
        saved.write_text(json.dumps(report, indent=1) + "\n")
        comm.Barrier()
        if comm.rank == 0:
            (out / f"{name}_done").write_text("done\n")
        clock = time.perf_counter()

    if plan["analysis"]:
        make_analysis(rank, out / "analysis.npy")
        done("analysis")
    analysis = Analysis(rank, out / "analysis.npy")

    def phase(name: str, links: list[CouplingLink], body) -> None:
        rank.timing = new_timing()
        io_before = io_threads_cpu_s()
        body()
        io_after = io_threads_cpu_s()
        report[f"{name}_timing"] = dict(rank.timing)
        report[f"{name}_link"] = link_report(links, None if io_before is None else io_after - io_before)
        for link in links:
            link.close(flush_s=30.0)

    bias_file = out / "bias" / f"rank{comm.rank}.npy"
    if plan["nudged"]:
        nudged = [training_link(exp.coupling(), endpoints[f"rl_nudged/s{s}"], out, f"rl_nudged/s{s}", comm.rank)
                  for s in range(exp.seeds)]
        record = out / "increments" / f"rank{comm.rank}.npz"
        phase("train", nudged, lambda: save_array(bias_file, train(rank, analysis, nudged, record=record)))
        done("train")
    bias = np.load(bias_file)
    for s in plan["free_seeds"]:  # each seed's link opens when its forecasts start: one left idle through
        member = f"rl_free/s{s}"  # the others' would sit silent past the learner's timeout
        if not wait_for(out / f"policy_init_{stem(member)}.npz", exp.policy_wait_s, comm):  # a warm start's
            raise RuntimeError(f"{member}: no first policy in {exp.policy_wait_s:g} s")
        link = training_link(exp.coupling(free=True), endpoints[member], out, member, comm.rank)
        offset = bias if exp.free_on_bias else 0.0
        phase(f"free-s{s}", [link], lambda link=link, offset=offset: train_free(rank, analysis, link, offset))
        done(f"free-s{s}")

    rank.timing = new_timing()
    frozen = CouplingConfig(**{**asdict(exp.coupling()), "explore": False})
    sums, eval_links, corrections = {}, {}, {}
    for member in exp.members():
        variant = member.split("/")[0]
        if variant == "native":
            correct, key = (lambda model, theta: None), "native"  # noqa: E731
        elif variant == "bias_corrected":
            correct, key = (lambda model, theta: bias), digest(bias.tobytes())  # noqa: E731
        else:
            policy = out / f"policy_{stem(member)}"
            if not wait_for(policy.with_suffix(".npz"), exp.policy_wait_s, comm):
                continue
            key = digest(policy.with_suffix(".npz").read_bytes())
            link = eval_links[member] = CouplingLink(frozen, comm.rank, runtime.load(policy))
            offset = bias if variant == "rl_free" and exp.free_on_bias else None  # a residual on the bias
            if offset is not None:
                key += "+" + digest(bias.tobytes())

            def correct(model, theta, link=link, offset=offset):
                answer = link.exchange(model.features(theta), {"context": model.context(theta)})
                return answer if offset is None else offset + answer
        cache = out / "forecasts" / f"{stem(member)}.rank{comm.rank}.npz"
        sums[member] = cached(cache, key, lambda correct=correct: forecast_errors(rank, analysis, correct), comm)
        corrections[member] = (correct, key)
    default = f"{DEFAULT_VARIANT}/s0"
    stability = free_run(rank, analysis, eval_links[default]) if default in eval_links else {"finite": False}
    report.update(eval_timing=dict(rank.timing), stability={
        k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in stability.items()})
    report["eval_link"] = {m: {k: getattr(link.stats, k) for k in (
        "link_s", "link_cpu_s", "inference_s", "inference_cpu_s", "exchanges")} for m, link in eval_links.items()}
    report["wall_s"]["eval"] = time.perf_counter() - clock
    clock = time.perf_counter()
    climate = {}  # the truth's climate run and each system's (first seed), paired: one start, one weather
    for member in ("truth", *(m for m in exp.members() if "/" not in m or m.endswith("/s0"))):
        if member == "truth":
            cfg, correct, key = rank.truth_cfg, None, "truth"
        elif member in corrections:
            cfg, (correct, key) = rank.model_cfg, corrections[member]
        else:
            continue
        cache = out / "climate" / f"{stem(member)}.rank{comm.rank}.npz"
        climate[member] = cached(cache, f"{key}-{exp.climate_days:g}d", lambda cfg=cfg, correct=correct: climate_run(
            rank, analysis, cfg, correct), comm)
    report["wall_s"]["climate"] = time.perf_counter() - clock
    reports = comm.gather(report, root=0)
    evaluated = list(sums)
    totals = summed_over_ranks(sums, ("abs", "signed", "unbounded", "weights"), comm)
    climate_totals = summed_over_ranks(climate, ("series", "weights", "hist", "bounded"), comm)
    if comm.rank == 0:
        np.savez(out / "forecast_sums.npz", members=np.array(evaluated), **totals)
        np.savez(out / "climate_sums.npz", members=np.array(list(climate)), ranks=comm.size, **climate_totals)
        (out / "ranks.json").write_text(json.dumps(reports, indent=1) + "\n")


def summed_over_ranks(by_member: dict[str, dict[str, np.ndarray]], keys, comm) -> dict[str, np.ndarray]:
    """Each of ``keys``, stacked over the members (in their order), summed over every rank onto rank 0."""
    from mpi4py import MPI

    totals = {}
    for key in keys:
        local = np.stack([sums[key] for sums in by_member.values()]) if by_member else np.zeros(0)
        totals[key] = np.zeros_like(local)
        comm.Reduce(local, totals[key], op=MPI.SUM, root=0)
    return totals


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def save_array(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(exist_ok=True)
    np.save(path, array)


def cached(path: Path, key: str, compute, comm) -> dict[str, np.ndarray]:
    """A forecast system's sums on this rank, read back when ``path`` holds them for the same ``key``
    (the policy's bytes): a resumed run forecasts only what it has not. The sums are read back only
    when every rank holds its own, so all ranks run the forecasts (halo exchanges) or none."""
    stored = {}
    if path.exists():
        with np.load(path, allow_pickle=False) as saved:
            if str(saved["key"]) == key:
                stored = {name: saved[name] for name in saved.files if name != "key"}
    if all(comm.allgather(bool(stored))):
        return stored
    sums = compute()
    path.parent.mkdir(exist_ok=True)
    partial = path.with_name(path.name + ".partial.npz")
    np.savez(partial, key=np.array(key), **sums)
    partial.replace(path)
    return sums


def learners_main(exp_args: dict, plan: dict, out: str, endpoint_queue, min_updates: int, max_s: float) -> None:
    """The online learners the plan still trains (both RL variants, every seed), in one process, polled
    and trained in turn.

    A learner is finished when its ranks' phase is done (``train_done`` / ``free-sN_done``) and it has
    made ``min_updates``; it then writes its final export ``policy_<name>`` and its record into
    ``learners.json`` (beside those of earlier runs of the same experiment)."""
    from embodyrl.coupling import CouplingLearner, CouplingLearnerConfig

    exp = config_of(exp_args)
    out_dir = Path(out)
    learners, done_file = {}, {}
    to_train = [("rl_nudged", s, "train_done") for s in range(exp.seeds) if plan["nudged"]]
    to_train += [("rl_free", s, f"free-s{s}_done") for s in plan["free_seeds"]]
    cold = {}  # name -> the export that starts it, once written (free-forecast learners with free_start)
    for variant, seed, marker in to_train:
        name = f"{variant}/s{seed}"
        config = CouplingLearnerConfig(seed=seed, capacity=LEARNER_CAPACITY)
        if variant == "rl_free":
            config = replace(config, ddpg=replace(config.ddpg, actor_lr=exp.free_actor_lr,
                                                  bc_weight=exp.free_bc_weight,
                                                  actor_starts_after=exp.free_actor_starts_after))
        learner = learners[name] = CouplingLearner(exp.coupling(free=variant == "rl_free"), config,
                                                   metrics_dir=out_dir / "metrics" / stem(name))
        learner.warm_up()
        if variant == "rl_free" and exp.free_on_bias:  # a residual on the bias correction
            learner.start_at_zero()
            save_atomically(out_dir, f"policy_init_{stem(name)}", *learner.export())
        elif variant == "rl_free" and exp.free_start:
            cold[name] = out_dir / f"policy_{exp.free_start}-s{seed}.npz"
        else:
            save_atomically(out_dir, f"policy_init_{stem(name)}", *learner.export())
        done_file[name] = out_dir / marker
    endpoint_queue.put({name: learner.endpoint for name, learner in learners.items()})
    record_file = out_dir / "learners.json"
    records = json.loads(record_file.read_text()) if record_file.exists() else {}
    start = time.monotonic()
    while learners and time.monotonic() - start < max_s:
        trained = False
        for name, start_from in list(cold.items()):  # its ranks wait for its first policy
            if start_from.exists():
                with np.load(start_from, allow_pickle=False) as arrays:
                    learners[name].warm_start(dict(arrays))
                save_atomically(out_dir, f"policy_init_{stem(name)}", *learners[name].export())
                del cold[name]
        for name, learner in list(learners.items()):
            learner.poll(0)
            trained = learner.train() or trained
            if done_file[name].exists() and learner.updates >= min_updates:
                learner.poll(0)
                records[name] = finish_learner(learner, out_dir, name, start)
                del learners[name]
                record_file.write_text(json.dumps(records, indent=1) + "\n")
        if not trained and learners:
            next(iter(learners.values())).poll(20)  # nothing to train yet: wait a little on one socket
    for name, learner in learners.items():  # out of time: what they have
        records[name] = finish_learner(learner, out_dir, name, start)
    record_file.write_text(json.dumps(records, indent=1) + "\n")


def finish_learner(learner, out_dir: Path, name: str, start: float) -> dict:
    learner.publish()
    graph, arrays = learner.export()
    save_atomically(out_dir, f"policy_{stem(name)}", graph, arrays)
    record = {"updates": learner.updates, "published": learner.published, "column_steps": learner.size,
              "steps_by_rank": {str(k): v for k, v in sorted(learner.steps_by_rank.items())},
              "metrics": learner.metrics, "wall_s": time.monotonic() - start,
              "discount": learner.config.ddpg.discount, "batch_columns": learner.config.ddpg.batch_size}
    learner.close()
    return record


def save_atomically(out_dir: Path, name: str, graph: dict, arrays: dict) -> None:
    """The export under a temporary stem, then renamed, the ``.npz`` last: ranks wait for it."""
    json_path, npz_path = runtime.save(out_dir / f"{name}_partial", graph, arrays)
    json_path.replace(out_dir / f"{name}.json")
    npz_path.replace(out_dir / f"{name}.npz")


def baselines_main(exp_args: dict, out: str, mlp_steps: int, max_s: float) -> None:
    """Once the nudged phase is done: the ridge regression, the polynomial and every seed's MLP, fitted
    to the recorded increments and exported (``policy_ridge``, ``policy_polynomial``, ``policy_mlp-sN``);
    their held-out fit and the gap check in ``baselines.json`` (fitted on every training start but the
    last, scored on the last)."""
    from embodyrl.coupling import baselines
    from embodyrl.coupling.learner import CouplingLearnerConfig
    from embodyrl.hal.steps import PolicyVersion, new_incarnation

    exp = config_of(exp_args)
    out_dir = Path(out)
    deadline = time.monotonic() + max_s
    while not (out_dir / "train_done").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    data = baselines.Increments.load(sorted((out_dir / "increments").glob("rank*.npz")))
    coupling, ddpg = exp.coupling(), CouplingLearnerConfig().ddpg
    last = len(exp.train_starts_days) - 1
    fit, held = data.where(data.start < last), data.where(data.start == last)
    w, b, ridge = baselines.fit_ridge_validated(fit, held, coupling)
    pw, pb, poly = baselines.fit_ridge_validated(fit, held, coupling, degree=2)
    networks, params = baselines.fit_mlp(fit, coupling, ddpg, seed=0, steps=mlp_steps)
    report = {"rows": len(data), "level_rows": len(data) * coupling.levels,
              "heldout_start_days": exp.train_starts_days[last],
              "increment_std_kday": float(held.increment.std()),
              "ridge_r2_heldout": ridge["r2_heldout"], "ridge_l2": ridge["l2"], "ridge_r2_by_l2": ridge["r2_by_l2"],
              "polynomial_r2_heldout": poly["r2_heldout"], "polynomial_l2": poly["l2"],
              "polynomial_r2_by_l2": poly["r2_by_l2"],
              "mlp_r2_heldout": baselines.r2(baselines.mlp_predict(networks, params, held), held.increment)}
    report["ridge_unexplained_fraction_heldout"] = 1.0 - report["ridge_r2_heldout"]
    report["gap"] = baselines.gap_check(report["mlp_r2_heldout"], {"ridge": ridge["r2_heldout"],
                                                                   "polynomial": poly["r2_heldout"]})
    incarnation = new_incarnation()
    save_atomically(out_dir, "policy_ridge", *baselines.ridge_policy(coupling, w, b, PolicyVersion(incarnation, 1)))
    save_atomically(out_dir, "policy_polynomial",
                    *baselines.ridge_policy(coupling, pw, pb, PolicyVersion(incarnation, 1), degree=2))
    for s in range(exp.seeds):
        networks, params = baselines.fit_mlp(data, coupling, ddpg, seed=s, steps=mlp_steps)
        save_atomically(out_dir, f"policy_mlp-s{s}",
                        *baselines.mlp_policy(networks, params, ddpg, PolicyVersion(incarnation, 2 + s)))
    report["mlp_steps"] = mlp_steps
    (out_dir / "baselines.json").write_text(json.dumps(report, indent=1) + "\n")


def config_of(args: dict) -> ExperimentConfig:
    return ExperimentConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})


def everything(exp: ExperimentConfig) -> dict:
    """The plan of a run that starts from nothing."""
    return {"analysis": True, "nudged": True, "free_seeds": list(range(exp.seeds)), "baselines": True}


def plan_of(out: Path, exp: ExperimentConfig, ranks: int) -> dict:
    """What a run in ``out`` still has to do: a phase whose outputs all exist is not run again, so a run
    stopped part way resumes with the same command. A phase to run loses its partial outputs first, and
    so does what was computed from them (the baselines from the nudged phase's increments). Forecasts
    are cached per system and rank, keyed by the policy's bytes (:func:`cached`)."""
    def have(*names: str) -> bool:
        return all((out / name).exists() for name in names)

    def drop(*patterns: str) -> None:
        remove(out, patterns)

    seeds = range(exp.seeds)
    by_rank = [f"{folder}/rank{r}.{ext}" for r in range(ranks) for folder, ext in (("bias", "npy"),
                                                                                  ("increments", "npz"))]
    nudged = not have("train_done", *by_rank, *(f"policy_rl_nudged-s{s}.npz" for s in seeds))
    if nudged:
        drop("train_done", "bias", "increments", "policy_rl_nudged-*", "policy_init_rl_nudged-*")
    free_seeds = [s for s in seeds if not have(f"free-s{s}_done", f"policy_rl_free-s{s}.npz")]
    for s in free_seeds:
        drop(f"free-s{s}_done", f"policy_rl_free-s{s}.*", f"policy_rl_free-s{s}_partial.*",
             f"policy_init_rl_free-s{s}.*")
    baselines = nudged or not have("baselines.json", "policy_ridge.npz", "policy_polynomial.npz",
                                   *(f"policy_mlp-s{s}.npz" for s in seeds))
    if baselines:
        drop("baselines.json", "policy_ridge*", "policy_polynomial*", "policy_mlp-*")
    analysis = not have("analysis_done", "analysis.npy")
    if analysis:
        drop("analysis_done")
    return {"analysis": analysis, "nudged": nudged, "free_seeds": free_seeds, "baselines": baselines}


def remove(out: Path, patterns) -> None:
    for pattern in patterns:
        for path in out.glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


RUN_FILES = ("analysis*", "*_done", "bias", "increments", "forecasts", "reports", "policy_*", "baselines.json",
             "learners.json", "forecast_sums.npz", "ranks.json", "ranks.log", "rank_args.json", "results.json",
             "experiment.json", "nwp_column_correction.png", "climate", "climate_sums.npz", "nwp_climate.png",
             "metrics")
"""What a run writes in its directory (``--fresh`` removes them, and nothing else)."""


def run(out: Path, ranks: int, exp: ExperimentConfig, plan: dict, min_updates: int, mlp_steps: int,
        timeout_s: float) -> None:
    """Start the learners, the baselines' fitter (if the plan has them) and the ranks; wait (bounded)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    helpers = [ctx.Process(target=learners_main, args=(asdict(exp), plan, str(out), queue, min_updates, timeout_s),
                           daemon=True)]
    if plan["baselines"]:
        helpers.append(ctx.Process(target=baselines_main, args=(asdict(exp), str(out), mlp_steps, timeout_s),
                                   daemon=True))
    for helper in helpers:
        helper.start()
    try:
        endpoints = queue.get(timeout=600)
        args = out / "rank_args.json"
        args.write_text(json.dumps({"experiment": asdict(exp), "out": str(out), "learners": endpoints,
                                    "plan": plan}))
        env = dict(os.environ)
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, "1")  # one thread per rank, as MPI models run (unless the user says otherwise)
        with open(out / "ranks.log", "a") as log:
            subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, __file__, "rank", str(args)],
                           stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=True, env=env)
        for helper in helpers:
            helper.join(timeout=60)
    finally:
        for helper in helpers:
            if helper.is_alive():
                helper.terminate()
                helper.join(10)


LEARNER_CAPACITY = 65_536
"""Column steps each online learner keeps (one phase streams about 49,000 on the full grid)."""
BOOTSTRAP = 2000
"""Resamples of the start dates for the 95 % intervals."""
NETWORK = "per-level MLP 21-64-64-1 (ReLU, tanh, x3 K/day), run at each of 70 levels"


def results(out: Path, ranks: int, exp: ExperimentConfig) -> dict:
    """``results.json``: every forecast system's errors by lead, band, seed, with intervals; the goals."""
    sums = np.load(out / "forecast_sums.npz", allow_pickle=False)
    members = [str(m) for m in sums["members"]]
    weights = sums["weights"][0]  # [bands], the same for every member
    ok = sums["unbounded"] == 0  # [members, starts]: every rank's columns bounded
    band = np.where(ok[:, :, None, None, None], sums["abs"] / weights, np.nan)  # [members, starts, leads, 2, bands]
    area = np.where(ok[:, :, None, None], sums["abs"].sum(-1) / weights.sum(), np.nan)  # [members, starts, leads, 2]
    drift = np.where(ok[:, :, None, None], sums["signed"] / weights.sum(), np.nan)  # global-mean error
    n = len(exp.eval_starts_days)
    resample = np.random.default_rng(0).integers(0, n, (BOOTSTRAP, n))

    def interval(per_start: np.ndarray) -> list[float]:
        """95 % bootstrap interval over start dates of the mean of ``per_start`` [starts]."""
        means = np.nanmean(per_start[resample], axis=1)
        return [float(np.nanpercentile(means, 2.5)), float(np.nanpercentile(means, 97.5))]

    by_variant = {}
    for variant in VARIANTS:
        idx = [i for i, m in enumerate(members) if m.split("/")[0] == variant]
        if not idx:
            continue
        seed_mean = np.nanmean(area[idx], axis=0)  # [starts, leads, 2]: the seeds' mean per start date
        leads = []
        for li, hours in enumerate(exp.lead_hours):
            entry = {"lead_hours": hours, "area_weighted": {}, "drift": {}, "bands": []}
            for j, field in enumerate(FIELDS):
                entry["area_weighted"][field] = {
                    "mean": float(np.nanmean(seed_mean[:, li, j])), "ci95": interval(seed_mean[:, li, j]),
                    "by_seed": [float(np.nanmean(area[i, :, li, j])) for i in idx]}
                entry["drift"][field] = float(np.nanmean(drift[idx, :, li, j]))
            for b, name in enumerate(BAND_NAMES):
                entry["bands"].append({"band": name, **{f"mae_{field}": float(np.nanmean(band[idx, :, li, j, b]))
                                                        for j, field in enumerate(FIELDS)}})
            leads.append(entry)
        by_variant[variant] = {"members": [members[i] for i in idx], "seeds": len(idx),
                               "bounded_fraction": float(ok[idx].mean()), "by_lead": leads}
    reports = json.loads((out / "ranks.json").read_text())
    return {
        "by_variant": by_variant,
        "units": {"z500": "m", "t850": "K"},
        "notes": {
            "mae": "area-weighted mean absolute error against the analysis; a seeded variant's mean is over its "
                   "seeds; forecasts that left bounds (bounded_fraction < 1) are left out of the means",
            "drift": "the area-weighted global mean of forecast minus analysis, mean over start dates",
            "ci95": f"percentile intervals from {BOOTSTRAP} bootstrap resamples of the {n} start dates (of the "
                    "seeds' mean per start date); start dates one day apart are not independent, so the "
                    "intervals are if anything narrow"},
        "goals": goals(by_variant, exp),
        "baselines": json.loads((out / "baselines.json").read_text()),
        "climate": climate_of(out, exp),
        **legacy(by_variant, exp),
        **stability(reports, weights, exp),
        **overheads(reports),
        "ranks": ranks,
        "columns_by_rank": [r["columns"] for r in reports],
        "learners": json.loads((out / "learners.json").read_text()),
        "wall_s": reports[0]["wall_s"],
        "experiment": asdict(exp),
    }


def climate_of(out: Path, exp: ExperimentConfig) -> dict | None:
    """Each system's climate run against the truth's (:func:`~embodyrl.coupling.nwp.climate_statistics`),
    by band, with the T850 histograms (area fractions) for the figure; None for a run without them."""
    path = out / "climate_sums.npz"
    if not path.exists():
        return None
    sums = np.load(path, allow_pickle=False)
    members = [str(m) for m in sums["members"]]
    series = sums["series"] / sums["weights"][:, None, :]  # [members, samples, bands]: band-mean T850
    truth = members.index("truth")
    per_day = int(DAY_S / (ColumnConfig().dt_s * exp.analysis_every))
    systems = {}
    for i, member in enumerate(members):
        if member == "truth":
            continue
        bounded = bool(sums["bounded"][i][0] == sums["ranks"])
        systems[member] = {"bounded": bounded, **(climate_statistics(series[i], sums["hist"][i], series[truth],
                                                                     sums["hist"][truth], per_day)
                                                  if bounded else {})}
    return {"days": exp.climate_days, "start_day": exp.eval_starts_days[0], "bins_k": CLIMATE_BINS.tolist(),
            "field": "T850, band means every 3 h and the columns' distribution by band", "by_member": systems,
            "truth_hist": (sums["hist"][truth] / sums["hist"][truth].sum(-1, keepdims=True)).tolist(),
            "hist": {m: (sums["hist"][i] / np.maximum(sums["hist"][i].sum(-1, keepdims=True), 1e-300)).tolist()
                     for i, m in enumerate(members) if m != "truth"}}


def legacy(by_variant: dict, exp: ExperimentConfig) -> dict:
    """The earlier results' keys, for the native model, the constant bias and the default variant."""
    present = {k: v for k, v in (("native", "native"), ("bias_corrected", "bias_corrected"),
                                 (DEFAULT_VARIANT, "corrected")) if k in by_variant}

    def table(li: int) -> list[dict]:
        return [{"band": band, **{f"{prefix}_mae_{field}": by_variant[v]["by_lead"][li]["bands"][b][f"mae_{field}"]
                                  for v, prefix in present.items() for field in FIELDS}}
                for b, band in enumerate(BAND_NAMES)]

    def mean(li: int) -> dict:
        return {f"{prefix}_mae_{field}": by_variant[v]["by_lead"][li]["area_weighted"][field]["mean"]
                for v, prefix in present.items() for field in FIELDS}

    return {"default_variant": DEFAULT_VARIANT, "bands": table(0), "lead_hours": list(exp.lead_hours),
            "by_lead": [{"lead_hours": h, "bands": table(i), "area_weighted": mean(i)}
                        for i, h in enumerate(exp.lead_hours)],
            "area_weighted": mean(0)}


def stability(reports: list[dict], weights: np.ndarray, exp: ExperimentConfig) -> dict:
    """The default variant's long free run: finite, within bounds, band-mean Z500 drift."""
    stab = [r["stability"] for r in reports]
    z0 = np.sum([s.get("z500_sum_start", np.zeros(6)) for s in stab], 0) / weights
    z1 = np.sum([s.get("z500_sum_end", np.full(6, np.nan)) for s in stab], 0) / weights
    drift = np.abs(z1 - z0)
    largest = max(s.get("largest_correction", np.inf) for s in stab)
    stable = bool(all(s["finite"] for s in stab) and largest <= exp.max_correction + 1e-4
                  and np.isfinite(drift).all() and drift.max() < 300.0)
    return {"stable": stable, "stability": {"variant": f"{DEFAULT_VARIANT}/s0", "free_run_days": exp.free_run_days,
                                            "largest_correction_kday": largest, "bound_kday": exp.max_correction,
                                            "z500_band_drift_m": drift.tolist()}}


def overheads(reports: list[dict]) -> dict:
    """The link's and the policy's cost beside the model's, in the nudged training phase (every rank's
    clocks summed), per link: each rank there drives one link per seed over the same steps."""
    def total(phase: str, key: str) -> float:
        return sum((r[phase] or {}).get(key) or 0.0 for r in reports)

    links = reports[0]["train_link"]["links"]
    column_steps = sum(r["columns"] * r["train_timing"]["steps"] for r in reports)
    model_s, model_cpu = total("train_timing", "model_s"), total("train_timing", "model_cpu_s")
    halo_cpu = total("train_timing", "halo_wait_cpu_s")
    link_cpu = (total("train_link", "link_cpu_s") + total("train_link", "io_threads_cpu_s")) / links
    inference_cpu = total("train_link", "inference_cpu_s") / links
    physics_cpu = model_cpu - halo_cpu
    return {
        "us_per_column_step": {
            "physics": 1e6 * physics_cpu / column_steps, "link": 1e6 * link_cpu / column_steps,
            "inference": 1e6 * inference_cpu / column_steps, "inference_network": NETWORK,
            "features": 1e6 * total("train_timing", "feature_cpu_s") / column_steps,
            "halo_wait": 1e6 * halo_cpu / column_steps, "column_steps": column_steps,
            "clock": "CPU: the rank thread's (model, link, features) and the ZeroMQ I/O threads' (link); "
                     "inference on the process clock (BLAS threads included); nudged training phase"},
        "link_overhead_fraction": link_cpu / physics_cpu,
        "link_overhead_fraction_cpu": link_cpu / model_cpu,
        "link_overhead_fraction_wall": total("train_link", "link_s") / links / model_s,
        "link_overhead_clock": "cpu; the model step without its halo waits (MPICH spins while a neighbour is "
                               "descheduled); the strictest of the three",
        "inference_fraction": inference_cpu / physics_cpu,
        "inference_fraction_wall": total("train_link", "inference_s") / links / model_s,
        "feature_fraction": total("train_timing", "feature_cpu_s") / physics_cpu,
        "timing_s": {"train_model_wall": model_s, "train_model_cpu": model_cpu, "train_halo_wait_cpu": halo_cpu,
                     "train_halo_wait_wall": total("train_timing", "halo_wait_s"),
                     "train_link_wall": total("train_link", "link_s"),
                     "train_link_cpu_rank_threads": total("train_link", "link_cpu_s"),
                     "train_link_cpu_io_threads": total("train_link", "io_threads_cpu_s"),
                     "train_inference_wall": total("train_link", "inference_s"),
                     "train_inference_cpu": total("train_link", "inference_cpu_s"),
                     "train_exchanges": total("train_link", "exchanges"), "train_links_per_rank": links},
    }


LABELS = {"native": "native", "bias_corrected": "constant bias", "ridge": "ridge (offline)",
          "polynomial": "polynomial, degree 2 (offline)", "mlp": "MLP (offline)", "rl_nudged": "DDPG, nudged (discount 0)", "rl_free": "DDPG, free forecasts"}


def plot(res: dict, path: Path) -> None:
    """Area-weighted Z500 and T850 MAE against lead time for every variant, with 95 % intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for k, (variant, entry) in enumerate(res["by_variant"].items()):
        hours = np.array([d["lead_hours"] for d in entry["by_lead"]], float) * (1 + 0.012 * (k - 2.5))
        for ax, field, unit in zip(axes, FIELDS, ("m", "K"), strict=True):
            values = [d["area_weighted"][field] for d in entry["by_lead"]]
            mean = np.array([v["mean"] for v in values])
            err = np.abs(np.array([v["ci95"] for v in values]).T - mean)
            ax.errorbar(hours, mean, yerr=err, marker="o", ms=3, capsize=2,
                        label=f"{LABELS[variant]}" + (f" ({entry['seeds']} seeds)" if entry["seeds"] > 1 else ""))
            ax.set_ylabel(f"area-weighted {field.upper()} MAE ({unit})")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("lead time (h)")
        ax.set_xticks(res["lead_hours"], [str(h) for h in res["lead_hours"]])
    axes[0].legend(fontsize=7)
    bounded = "every forecast bounded" if res["goals"]["all_forecasts_bounded"] else "some forecasts unbounded"
    axes[1].set_title(f"{len(res['experiment']['eval_starts_days'])} start dates, 95 % intervals; {bounded}",
                      fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_climate(res: dict, path: Path) -> None:
    """The climate runs against the truth's: the Hellinger distance of each system's T850 distribution by
    band, and the distributions of the tropical band that moist convection heats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    climate = res["climate"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(BAND_NAMES))
    members = list(climate["by_member"])
    width = 0.8 / max(len(members), 1)
    for i, member in enumerate(members):
        entry = climate["by_member"][member]
        values = [b["hellinger"] for b in entry["bands"]] if entry["bounded"] else [np.nan] * len(x)
        axes[0].bar(x + (i - len(members) / 2) * width, values, width, label=LABELS.get(member.split("/")[0], member))
    axes[0].set_xticks(x, BAND_NAMES, fontsize=8)
    axes[0].set_ylabel("Hellinger distance to the truth's T850 distribution")
    axes[0].set_title(f"{climate['days']:g}-day free runs (first seed), one start, one weather", fontsize=9)
    axes[0].legend(fontsize=6)
    centres = 0.5 * (np.array(climate["bins_k"][1:]) + np.array(climate["bins_k"][:-1]))
    band = BAND_NAMES.index("0-30N")
    axes[1].plot(centres, climate["truth_hist"][band], color="black", linewidth=2, label="truth")
    for member in members:
        if climate["by_member"][member]["bounded"]:
            axes[1].plot(centres, climate["hist"][member][band], label=LABELS.get(member.split("/")[0], member))
    axes[1].set_xlabel("T850 (K), 0-30N")
    axes[1].set_ylabel("area fraction per K")
    support = np.flatnonzero(np.array(climate["truth_hist"][band]) > 1e-4)
    axes[1].set_xlim(centres[support[0]] - 6, centres[support[-1]] + 6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--ranks", type=int, default=4, help="MPI ranks of the model")
    parser.add_argument("--quick", action="store_true", help="a small grid and short periods (tests)")
    parser.add_argument("--testbed", choices=sorted(TESTBEDS), default="mistuned",
                        help="the model's error: mistuned parameters, or moist convection it lacks")
    parser.add_argument("--min-updates", type=int, default=None, help="each online learner's updates before its "
                                                                      "policy freezes")
    parser.add_argument("--mlp-steps", type=int, default=None, help="Adam steps of each offline MLP")
    parser.add_argument("--timeout-s", type=float, default=7200.0, help="bound on the whole run")
    parser.add_argument("--keep-analysis", action="store_true", help="keep DIR/analysis.npy")
    parser.add_argument("--fresh", action="store_true", help="start over: remove what an earlier run left in "
                                                             "DIR (by default a run resumes it)")
    parser.add_argument("--report", action="store_true", help="run nothing: write results.json and the figure "
                                                              "again from DIR's files")
    args = parser.parse_args(argv)
    testbed = ExperimentConfig.moist if args.testbed == "moist" else ExperimentConfig
    exp = testbed(**QUICK) if args.quick else testbed()
    if not 1 <= args.ranks <= exp.nlat:
        parser.error(f"--ranks must be between 1 and {exp.nlat} (one latitude row per rank at least)")
    min_updates = args.min_updates if args.min_updates is not None else (200 if args.quick else 8000)
    mlp_steps = args.mlp_steps if args.mlp_steps is not None else (200 if args.quick else 8000)
    if args.report:
        earlier = json.loads((args.out / "results.json").read_text())
        res = {**earlier, **results(args.out, earlier["ranks"], config_of(earlier["experiment"]))}
        (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
        plot(res, args.out / "nwp_column_correction.png")
        if res.get("climate"):
            plot_climate(res, args.out / "nwp_climate.png")
        print_table(res)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        remove(args.out, RUN_FILES)
    identity = json.loads(json.dumps({"experiment": asdict(exp), "ranks": args.ranks, "min_updates": min_updates,
                                      "mlp_steps": mlp_steps}))
    stored = args.out / "experiment.json"
    if stored.exists() and json.loads(stored.read_text()) != identity:
        parser.error(f"{args.out} holds a run of another configuration ({stored}); resume it with the same "
                     "options, or start over with --fresh")
    stored.write_text(json.dumps(identity, indent=1) + "\n")
    plan = plan_of(args.out, exp, args.ranks)
    print(f"plan: {json.dumps(plan)}", flush=True)
    start = time.monotonic()
    run(args.out, args.ranks, exp, plan, min_updates, mlp_steps, args.timeout_s)
    res = results(args.out, args.ranks, exp)
    res["total_wall_s"] = time.monotonic() - start
    res["plan"] = plan
    (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, args.out / "nwp_column_correction.png")
    if res.get("climate"):
        plot_climate(res, args.out / "nwp_climate.png")
    if not args.keep_analysis:
        for path in (args.out / "analysis.npy", args.out / "analysis_done"):
            path.unlink(missing_ok=True)
    print_table(res)
    return 0


def print_table(res: dict) -> None:
    leads = [h for h in (24, 72) if h in res["lead_hours"]]
    print(f"{'variant':>16} " + " ".join(f"{f'{f} +{h}h':>22}" for h in leads for f in ("Z500 m", "T850 K")))
    for variant, entry in res["by_variant"].items():
        cells = []
        for h in leads:
            d = entry["by_lead"][res["lead_hours"].index(h)]["area_weighted"]
            cells += [f"{d[f]['mean']:.3f} [{d[f]['ci95'][0]:.3f},{d[f]['ci95'][1]:.3f}]" for f in FIELDS]
        print(f"{variant:>16} " + " ".join(f"{c:>22}" for c in cells))
    b, cost = res["baselines"], res["us_per_column_step"]
    print(f"held-out increment R2: ridge {b['ridge_r2_heldout']:.3f} polynomial "
          f"{b.get('polynomial_r2_heldout', float('nan')):.3f} mlp {b['mlp_r2_heldout']:.3f}; "
          f"us per column-step: physics {cost['physics']:.1f} link {cost['link']:.2f} "
          f"inference {cost['inference']:.1f}")
    goal = res["goals"]["beats_offline_fits_by_20_percent"]
    print(f"stable={res['stable']} all_forecasts_bounded={res['goals']['all_forecasts_bounded']} "
          f"goal_met={goal['met']} (best {goal['best_learnt_variant']}) wall={res['total_wall_s']:.0f} s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["rank"]:  # one MPI rank, started by run() under mpiexec
        rank_main(sys.argv[2])
    else:
        sys.exit(main())
