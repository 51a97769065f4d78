"""VRDQ on a grid world: error to Q* against samples per agent (1, 2, 4, 8 agents) and
against consensus rounds per epoch; writes a JSON of the figures and a PNG plot.

    python examples/vrdq_sweep.py --out docs/figures/vrdq --seeds 3 --epochs 400
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from embodyrl.algos import vrdq
from embodyrl.envs.tabular import grid_world, q_star


def curves(mdp, truth, agents, rounds, topology, epochs, seeds):
    errors = []
    for seed in range(seeds):
        cfg = vrdq.VRDQConfig(num_agents=agents, consensus_rounds=rounds,
                              topology=topology if agents > 2 else "complete")
        state, err = vrdq.run(mdp, cfg, epochs, seed=seed, q_star=truth)
        errors.append(err)
    return np.mean(errors, axis=0), int(state.messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="vrdq")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=400)
    parser.add_argument("--topology", default="ring", choices=vrdq.TOPOLOGIES)
    args = parser.parse_args()
    mdp = grid_world(reward_noise=0.5)
    truth = q_star(mdp)
    result = {"mdp": "grid_world(4x4, slip 0.2, gamma 0.9, reward noise 0.5)", "epochs": args.epochs,
              "seeds": args.seeds, "topology": args.topology, "agents": {}, "rounds": {}}
    by_agents = {}
    for m in (1, 2, 4, 8):
        err, messages = curves(mdp, truth, m, 3, args.topology, args.epochs, args.seeds)
        by_agents[m] = err
        result["agents"][m] = {"final_error": float(err[-1]), "messages": messages}
    by_rounds = {}
    for rounds in (1, 2, 4, 8):
        err, messages = curves(mdp, truth, 8, rounds, args.topology, args.epochs, args.seeds)
        by_rounds[rounds] = err
        result["rounds"][rounds] = {"final_error": float(err[-1]), "messages": messages}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    samples = np.arange(1, args.epochs + 1)  # one sample per (s, a) per epoch per agent
    for m, err in by_agents.items():
        axes[0].plot(samples, err, label=f"{m} agent{'s' if m > 1 else ''}")
    axes[0].set(xlabel="samples per (s, a) per agent", ylabel="mean max |Q - Q*|", yscale="log",
                title=f"agents ({args.topology}, 3 rounds/epoch)")
    for rounds, err in by_rounds.items():
        axes[1].plot(samples, err, label=f"{rounds} round{'s' if rounds > 1 else ''}")
    axes[1].set(xlabel="samples per (s, a) per agent", yscale="log", title=f"8 agents, {args.topology}")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
