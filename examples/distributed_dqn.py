"""Neural distributed Q-learning on Gymnasium's CartPole-v1: 1, 2 and 4 learners.

Each learner is a spawned process with its own CartPole environments (its
actor, stepped in lockstep), its own n-step replay and double DQN; every
``--epoch-steps`` environment steps per learner they average their
parameters over loopback peer links (complete graph, one round: the exact
average) and evaluate the greedy policy on 10 seeded episodes, which decide
when to stop (475). Reported per team: environment steps (per learner and
summed) and wall-clock time until the stop, the messages sent, and the
return of the stopped policy on 20 fresh seeds that no decision saw (the
stopping episodes' own return is selected by the rule and flatters it).

    python examples/distributed_dqn.py --learners 1 2 4 --seeds 0 --out docs/figures/dqn_cartpole.json
    python examples/distributed_dqn.py --plot docs/figures/dqn_cartpole.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def run(learners: int, seed: int, args) -> dict:
    from embodyrl.algos.dqn import DQNConfig
    from embodyrl.algos.dqn.distributed import RunConfig
    from embodyrl.learner.consensus import run_team

    config = DQNConfig(hidden_sizes=(64, 64), learning_rate=args.lr, n_step=3, batch_size=64,
                       target_period=args.target_period, epsilon_decay_steps=args.epsilon_decay_steps)
    run_config = RunConfig(num_envs=4, max_env_steps=args.max_steps, epoch_steps=args.epoch_steps,
                           target_return=475.0, seed=seed, updates_per_step=args.updates_per_step)
    results = run_team(learners, config, run_config, timeout_s=args.timeout_s)
    history = results[0]["history"]
    last = history[-1]
    reached = last["team_eval_return"] >= 475.0
    return {"learners": learners, "seed": seed, "reached": reached,
            "env_steps_per_learner": last["env_steps"], "env_steps_total": last["env_steps"] * learners,
            "wall_s": max(r["history"][-1]["wall_s"] for r in results),
            "messages_per_learner": last["messages_out"], "bytes_per_learner": last["bytes_out"],
            "stopping_return": last["team_eval_return"],
            "fresh_seed_return": float(np.mean([r["report_return"] for r in results])),
            "curve": [(h["env_steps"], h["team_eval_return"]) for h in history],
            "spread_before": [h["spread_before"] for h in history]}


def summarise(runs: list[dict]) -> dict:
    """Medians of the costs; the fresh-seed return's mean, its spread over seeds, and each seed's."""
    fresh = [r["fresh_seed_return"] for r in runs]
    return {**{key: float(np.median([r[key] for r in runs]))
               for key in ("env_steps_per_learner", "env_steps_total", "wall_s")},
            "fresh_seed_return_mean": float(np.mean(fresh)), "fresh_seed_return_min": float(np.min(fresh)),
            "fresh_seed_return_by_seed": {str(r["seed"]): r["fresh_seed_return"] for r in runs},
            "stopping_return_mean": float(np.mean([r["stopping_return"] for r in runs]))}


def plot(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in data["runs"]:
        steps, rets = zip(*r["curve"], strict=True)
        ax.plot(steps, rets, color=f"C{[1, 2, 4].index(r['learners']) if r['learners'] in (1, 2, 4) else 3}",
                marker="o", ms=3, label=f"{r['learners']} learner(s), seed {r['seed']}")
    ax.axhline(475, color="k", ls="--", lw=0.8)
    ax.set(xlabel="env steps per learner", ylabel="greedy eval return (team mean)",
           title="distributed double DQN on CartPole-v1")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=100)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--max-steps", type=int, default=100_000, help="per learner")
    parser.add_argument("--epoch-steps", type=int, default=2_000, help="env steps per learner between consensus")
    parser.add_argument("--epsilon-decay-steps", type=int, default=10_000)
    parser.add_argument("--updates-per-step", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--target-period", type=int, default=500, help="gradient steps between target copies")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--out", type=Path, default=Path("docs/figures/dqn_cartpole.json"),
                        help="results file; runs already in it are kept (a file without fresh-seed "
                             "returns is refused: use another)")
    parser.add_argument("--plot", type=Path, help="only redraw the figure of this results file")
    args = parser.parse_args()
    if args.plot:
        print(plot(args.plot))
        return
    runs = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
    if any("fresh_seed_return" not in r for r in runs):
        raise SystemExit(f"{args.out} holds runs without a fresh-seed return; write to another --out")
    done = {(r["learners"], r["seed"]) for r in runs}
    for seed in args.seeds:
        for n in args.learners:
            if (n, seed) in done:
                continue
            r = run(n, seed, args)
            runs.append(r)
            print(f"{n} learner(s), seed {seed}: reached={r['reached']} after {r['env_steps_per_learner']} steps "
                  f"per learner ({r['env_steps_total']} total), {r['wall_s']:.0f} s, "
                  f"{r['messages_per_learner']} messages per learner; on 20 fresh seeds {r['fresh_seed_return']:.1f}",
                  flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            summary = {str(n): summarise([x for x in runs if x["learners"] == n])
                       for n in sorted({x["learners"] for x in runs})}
            args.out.write_text(json.dumps({"max_steps": args.max_steps, "epoch_steps": args.epoch_steps,
                                            "runs": runs, "summary": summary}, indent=1) + "\n")
    plot(args.out)


if __name__ == "__main__":
    main()
