"""Synchronous PPO against asynchronous PPO at staleness 1, 4 and 16 on the pendulum swing-up.

Every run is a real ``embodyrl train pendulum --algorithm ppo`` (a learner
process and ``--actors`` actor processes on loopback sockets) with the same
environment-step budget; only ``ppo.max_staleness`` changes. The actors run
in real time as a robot would (``actor.realtime``: a RateClock paces each
at ``actor.time_scale`` x the pendulum's 20 Hz control rate, so a run fits
in minutes), so env time cannot be bought with CPU. Synchronous PPO (k = 0)
is the textbook one: the actors act exactly one iteration's rows, then
stay paused (counted) until the new weights come; asynchronous actors act
on while the learner trains. For each run: the saved (deterministic)
policy's return and a uniform random policy's on the same 10 seeded
episodes, the wall-clock time (whole run, and from the first env step to
the last, without process start-up and evaluation), the learner's mean
staleness, effective sample size, learning-rate scale and discarded share,
and the actors' paused control periods and missed clock deadlines.
Improvement = final return - random return; the goal is asynchronous PPO
recovering at least 90% of synchronous PPO's improvement in less time.

    python examples/ppo_staleness.py --seeds 0 1 2 --out docs/figures/ppo_staleness.json
    python examples/ppo_staleness.py --plot docs/figures/ppo_staleness.json   # redraw the figure
    python examples/ppo_staleness.py --table docs/figures/ppo_staleness.json  # the docs' markdown table
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

STALENESS = (0, 1, 4, 16)
# What PPO needs on the swing-up (tried on seed 0): gamma 0.95, rewards scaled by 0.1, a wide
# initial Gaussian, 1024-step iterations of 16 segments of 64 steps from 4 actors, and a KL early
# stop (without it one iteration in a hundred jumped far, the pendulum spun and the values diverged),
# and no value clipping (with returns of tens, a 0.2 clip kept the values from following them).
SETTINGS = {"actors": 4, "ppo": {"discount": 0.95, "learning_rate": 3e-4, "init_log_std": 0.0,
                                 "reward_scale": 0.1, "rollout_length": 64, "rollouts_per_iteration": 16,
                                 "minibatches": 16, "target_kl": 0.03, "value_clip": 0.0},
            "learner": {"credit_quantum": 64},
            "actor": {"send_every": 32, "realtime": True, "time_scale": 10.0, "realtime_priority": 10}}


def run_one(staleness: int, seed: int, steps: int, root: Path) -> dict:
    from embodyrl.cli.launch import train
    from embodyrl.config import _merge, apply_algorithm_defaults, default_config, from_dict, to_dict

    data = to_dict(default_config("pendulum"))
    _merge(data, {**SETTINGS, "algorithm": "ppo", "steps": steps, "seed": seed})
    _merge(data, {"ppo": {"max_staleness": staleness}})
    config = from_dict(type(default_config("pendulum")), apply_algorithm_defaults(data, SETTINGS))
    run_dir = root / f"k{staleness}-s{seed}"
    return collect(staleness, seed, run_dir, train(config, run_dir, quiet=True))


def collect(staleness: int, seed: int, run_dir: Path, summary: dict) -> dict:
    """One run's figures from its summary, the learner's metrics and the actors' last reports."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in lines if "staleness_mean" in m]
    acting = [m for m in lines if m["env_steps"] > 0]  # from the first step in: no process start-up
    mean = lambda key: float(np.mean([m[key] for m in trained])) if trained else None  # noqa: E731
    actors = [json.loads(f.read_text().splitlines()[-1]) for f in sorted(run_dir.glob("actor-*.jsonl"))
              if "ledger" not in f.name]
    return {"staleness_setting": staleness, "seed": seed, "env_steps": summary["env_steps"],
            "wall_s": summary["wall_s"], "train_s": round(acting[-1]["time"] - acting[0]["time"], 1),
            "final_return": summary["eval_return_mean"],
            "random_return": summary["random_return_mean"],
            "improvement": summary["eval_return_mean"] - summary["random_return_mean"],
            "iterations": lines[-1]["updates"], "discarded_fraction": lines[-1]["discarded_fraction"],
            "staleness_mean": mean("staleness_mean"), "ess_fraction_mean": mean("ess_fraction"),
            "lr_scale_mean": mean("lr_scale"), "rows_behind": lines[-1]["rows_behind"],
            "discarded": lines[-1]["discarded"], "iteration_s_median": float(np.median(
                [m["iteration_s"] for m in lines if m.get("iteration_s") is not None])),
            "paused_fraction": sum(a["credit_paused_steps"] for a in actors)
            / max(1, sum(a["credit_paused_steps"] + a["env_steps"] for a in actors)),
            "credit_wait_s": float(np.mean([a["credit_wait_s"] for a in actors])),
            "clock_missed": sum(a["clock"].get("missed", 0) for a in actors),
            "clock_ticks": sum(a["clock"].get("ticks", 0) for a in actors),
            "curve": [(m["env_steps"], m["episode_return"]) for m in lines if m["episode_return"] is not None]}


def summarise(runs: list[dict]) -> dict:
    out = {}
    for k in STALENESS:
        rs = [r for r in runs if r["staleness_setting"] == k]
        if rs:
            out[str(k)] = {key: float(np.median([r[key] for r in rs]))
                           for key in ("final_return", "improvement", "wall_s", "train_s", "discarded_fraction",
                                       "staleness_mean", "ess_fraction_mean", "lr_scale_mean", "paused_fraction",
                                       "credit_wait_s", "iteration_s_median")
                           if all(r.get(key) is not None for r in rs)}
            out[str(k)]["seeds"] = len(rs)
    if "0" in out:
        for row in out.values():
            row["improvement_vs_sync"] = row["improvement"] / out["0"]["improvement"]
            row["wall_vs_sync"] = row["wall_s"] / out["0"]["wall_s"]
            row["train_vs_sync"] = row["train_s"] / out["0"]["train_s"]
    return out


def table(path: Path) -> str:
    """The results as the markdown table of docs/benchmarks.md: medians, each seed in brackets."""
    data = json.loads(path.read_text())
    summary = summarise(data["runs"])
    head = ("| setting | final return: median (seeds) | improvement over random | of sync's improvement "
            "| whole run s: median (seeds) | first to last env step s: median (seeds) | of sync's "
            "| paused for credit | mean staleness | mean ESS fraction | discarded | rows acted by replaced weights |")
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    for k in STALENESS:
        rs = sorted((r for r in data["runs"] if r["staleness_setting"] == k), key=lambda r: r["seed"])
        if not rs:
            continue
        row = summary[str(k)]
        def seeds(key: str, rs=rs) -> str:
            return ", ".join(f"{r[key]:.0f}" for r in rs)

        lines.append(
            f"| {'sync (k=0)' if k == 0 else f'async k={k}'} | {row['final_return']:.0f} ({seeds('final_return')}) "
            f"| {row['improvement']:.0f} | {row.get('improvement_vs_sync', float('nan')):.2f} "
            f"| {row['wall_s']:.0f} ({seeds('wall_s')}) | {row['train_s']:.0f} ({seeds('train_s')}) "
            f"| {row.get('train_vs_sync', float('nan')):.2f} | {row['paused_fraction']:.3f} "
            f"| {row['staleness_mean']:.2f} | {row['ess_fraction_mean']:.3f} "
            f"| {seeds('discarded')} | {seeds('rows_behind')} |")
    return "\n".join(lines)


def plot(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for k in STALENESS:
        rs = [r for r in data["runs"] if r["staleness_setting"] == k]
        for i, r in enumerate(rs):
            steps, rets = zip(*r["curve"], strict=True) if r["curve"] else ((), ())
            ax1.plot(steps, rets, color=f"C{STALENESS.index(k)}", alpha=0.6, label=f"k={k}" if i == 0 else None)
        if rs:
            ax2.scatter([r.get("train_s", r["wall_s"]) for r in rs], [r["improvement"] for r in rs],
                        color=f"C{STALENESS.index(k)}",
                        label="sync" if k == 0 else f"async k={k}")
    ax1.set(xlabel="env steps", ylabel="training episode return", title="PPO on the pendulum swing-up")
    ax2.set(xlabel="s from first to last env step", ylabel="final return - random",
            title="improvement against training time")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=100)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--staleness", type=int, nargs="+", default=list(STALENESS))
    parser.add_argument("--steps", type=int, default=120_000)
    parser.add_argument("--root", type=Path, default=Path("/tmp/ppo_staleness"))
    parser.add_argument("--out", type=Path, default=Path("docs/figures/ppo_staleness.json"))
    parser.add_argument("--plot", type=Path, help="only redraw the figure of this results file")
    parser.add_argument("--table", type=Path, help="only print the markdown table of this results file")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    if args.plot:
        print(plot(args.plot))
        return
    runs = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
    done = {(r["staleness_setting"], r["seed"]) for r in runs}
    failed: list[dict] = []
    for seed in args.seeds:
        for k in args.staleness:
            if (k, seed) in done:
                continue
            started = time.monotonic()
            try:
                runs.append(run_one(k, seed, args.steps, args.root))
            except Exception as err:  # a diverged or stuck run is a result too: recorded, not fatal
                print(f"k={k} seed={seed}: FAILED {type(err).__name__}: {str(err)[-300:]}", flush=True)
                failed.append({"staleness_setting": k, "seed": seed, "error": str(err)[-1000:]})
                continue
            r = runs[-1]
            print(f"k={k} seed={seed}: return {r['final_return']:.0f} (random {r['random_return']:.0f}), "
                  f"{r['wall_s']:.0f} s, acting {r['train_s']:.0f} s, staleness {r['staleness_mean']:.2f}, "
                  f"ess {r['ess_fraction_mean']:.3f}, discarded {r['discarded']} ({r['discarded_fraction']:.3f}), "
                  f"behind {r['rows_behind']}, paused {r['paused_fraction']:.3f}, "
                  f"missed {r['clock_missed']}/{r['clock_ticks']} [{time.monotonic() - started:.0f} s]", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"steps": args.steps, "settings": SETTINGS, "runs": runs,
                                            "failed": failed, "summary": summarise(runs)}, indent=1) + "\n")
    print(json.dumps(summarise(runs), indent=1))
    plot(args.out)


if __name__ == "__main__":
    main()
