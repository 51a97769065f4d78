"""Moving the hand against moving the joints: SAC on the 7-joint arm's reach, joint torques
(``arm_reach``) against end-effector moves through IK and a joint PD (``arm_reach_ee``); and the
hand moves learnt by CrossQ (its critics 256 wide) instead of SAC.

::

    nice -n 10 python examples/ee_reach.py --out runs/ee_reach --keep docs/figures/ee_reach   # resumes
    python examples/ee_reach.py --out runs/ee_reach-quick --quick                            # minutes

On two cores, ``--only VARIANT`` in processes sharing ``--out`` runs the variants side by side;
the last to finish writes the results and the plot.

Both tasks are the same arm, targets, reward and success (the hand within 5 cm of the target at
the episode's end); only the action differs. Each variant and seed trains with ``embodyrl train``
in segments (``--resume`` between them) and, after each, its saved policy runs ``--episodes``
seeded evaluation episodes (the same seeds for both variants). Each run's evaluations are
written to ``progress/`` as they happen, so the same command resumes an interrupted
experiment; with ``--keep DIR`` each finished run's config, summary and metrics are copied to
DIR and the plot to DIR.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hil_robot import CROSSQ_CPU_WIDTH, cli, save_json

VARIANTS = {"joint": ("arm_reach", "sac"), "end_effector": ("arm_reach_ee", "sac"),
            "end_effector_crossq": ("arm_reach_ee", "crossq")}
"""variant -> (task, algorithm)."""
LABELS = {"joint": "SAC, joint torques (arm_reach)", "end_effector": "SAC, end-effector moves (arm_reach_ee)",
          "end_effector_crossq": "CrossQ, end-effector moves"}
ALGORITHM_FLAGS = {"sac": (), "crossq": CROSSQ_CPU_WIDTH}


@dataclass(frozen=True)
class Plan:
    steps: int = 20_000
    points: int = 8
    """Evaluations, evenly spaced: every 2,500 steps."""
    seeds: tuple[int, ...] = (0, 1, 2)
    episodes: int = 20

    @classmethod
    def quick(cls) -> Plan:
        return cls(steps=400, points=1, seeds=(0,), episodes=1)


def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / "runs" / f"{variant}-s{seed}"


def load_progress(out: Path) -> dict:
    """``variant/seed`` -> its evaluations, one file per run (runs of two processes never share one)."""
    return {path.stem.replace("-s", "/"): json.loads(path.read_text()) for path in (out / "progress").glob("*.json")}


def train_to(out: Path, variant: str, seed: int, steps: int) -> None:
    run = run_dir(out, variant, seed)
    task, algorithm = VARIANTS[variant]
    args = ["train", task, "--run-dir", str(run), "--algorithm", algorithm, "--steps", str(steps),
            "--seed", str(seed), "--quiet", "--eval_episodes", "1", "--actor.credit_timeout_s", "3600",
            *ALGORITHM_FLAGS[algorithm]]
    if (run / "config.json").exists():
        args.append("--resume")
    else:
        args += ["--actor.random_steps", str(min(1000, steps // 2)), "--learner.min_replay", str(min(1000, steps // 2))]
    cli(*args, cwd=out, log=out / "commands.log")


def evaluate(out: Path, plan: Plan, variant: str, seed: int) -> dict:
    from embodyrl.cli.evaluate import evaluate_saved_run
    from embodyrl.runlog import learner_records

    run = run_dir(out, variant, seed)
    result = evaluate_saved_run(run, plan.episodes, seed=20_000 + 1000 * seed)  # the same episodes for both
    return {"steps": int(learner_records(run)[-1]["env_steps"]), "success_rate": result["success_mean"],
            "final_distance": result["final_distance_mean"], "return_mean": result["return_mean"]}


def results(progress: dict, plan: Plan, wall_s: float) -> dict:
    variants = {}
    for variant in VARIANTS:
        by_seed = {str(s): progress.get(f"{variant}/{s}", []) for s in plan.seeds}
        points = min(len(v) for v in by_seed.values())
        entry = {"steps": [by_seed[str(plan.seeds[0])][i]["steps"] for i in range(points)]}
        for key in ("success_rate", "final_distance"):
            entry[key] = [sum(v[i][key] for v in by_seed.values()) / len(by_seed) for i in range(points)]
            entry[f"{key}_by_seed"] = {s: [row[key] for row in v] for s, v in by_seed.items()}
        variants[variant] = entry
    return {"plan": asdict(plan), "variants": variants, "wall_s": round(wall_s, 1)}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (name, v) in enumerate(result["variants"].items()):
        colour = f"C{i}"
        for axis, key in ((left, "success_rate"), (right, "final_distance")):
            axis.plot(v["steps"], v[key], color=colour, marker="o", label=LABELS[name])
            for curve in v[f"{key}_by_seed"].values():
                axis.plot(v["steps"][:len(curve)], curve, color=colour, alpha=0.25, linewidth=0.8)
    episodes = result["plan"]["episodes"]
    left.set(xlabel="environment steps", ylabel=f"success: within 5 cm ({episodes} episodes)", ylim=(-0.02, 1.02))
    right.axhline(0.05, color="grey", linestyle=":", linewidth=0.8)
    right.set(xlabel="environment steps", ylabel="final distance to the target (m)", ylim=(0, None))
    left.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"The 7-joint arm's reach, mean of {len(result['plan']['seeds'])} seeds (each faint)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out: Path, plan: Plan, kept: Path | None = None, only: tuple[str, ...] = tuple(VARIANTS)) -> dict | None:
    """Train and evaluate the runs of the ``only`` variants; the results and the plot once every run
    of both has all its evaluations (two processes may share ``out``, one variant each)."""
    from embodyrl.runlog import keep_artifacts

    (out / "progress").mkdir(parents=True, exist_ok=True)
    save_json(out / "plan.json", asdict(plan))
    progress = load_progress(out)
    checkpoints = [round(plan.steps * (i + 1) / plan.points) for i in range(plan.points)]
    for seed in plan.seeds:
        for variant in only:
            key = f"{variant}/{seed}"
            done = progress.setdefault(key, [])
            if done and len(done) < plan.points and not (run_dir(out, variant, seed) / "config.json").exists():
                done.clear()  # a half run cannot resume without its replay and checkpoint
            for point in checkpoints[len(done):]:
                t0 = time.monotonic()
                train_to(out, variant, seed, point)
                row = evaluate(out, plan, variant, seed)
                row["wall_s"] = round(time.monotonic() - t0, 1)
                done.append(row)
                save_json(out / "progress" / f"{variant}-s{seed}.json", done)
                print(f"{key} @ {row['steps']}: success {row['success_rate']:.2f}, final distance "
                      f"{row['final_distance']:.3f} m ({row['wall_s']} s)", flush=True)
            if kept is not None:
                keep_artifacts([run_dir(out, variant, seed)], kept / "runs")
    progress = load_progress(out)
    if any(len(progress.get(f"{v}/{s}", [])) < plan.points for v in VARIANTS for s in plan.seeds):
        return None  # the other variant's process finishes it
    final = results(progress, plan, sum(row["wall_s"] for rows in progress.values() for row in rows))
    save_json(out / "results.json", final)
    plot(final, out / "ee_reach.png")
    if kept is not None:
        (kept / "progress").mkdir(parents=True, exist_ok=True)
        for name in ("plan.json", "results.json", *(f"progress/{p.name}" for p in (out / "progress").glob("*.json"))):
            (kept / name).write_bytes((out / name).read_bytes())
        kept.with_suffix(".png").write_bytes((out / "ee_reach.png").read_bytes())  # the figure beside its runs
    return final


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--keep", type=Path, help="copy each finished run's artifacts and the results here, the plot beside it")
    parser.add_argument("--quick", action="store_true", help="a tiny plan that checks the steps, not the learning")
    parser.add_argument("--only", choices=tuple(VARIANTS), help="one variant (other processes run the others)")
    args = parser.parse_args(argv)
    result = run(args.out.resolve(), Plan.quick() if args.quick else Plan(), args.keep.resolve() if args.keep else None,
                 (args.only,) if args.only else tuple(VARIANTS))
    if result is None:
        return 0
    json.dump({v: {"steps": e["steps"], "success_rate": e["success_rate"]} for v, e in result["variants"].items()},
              sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
