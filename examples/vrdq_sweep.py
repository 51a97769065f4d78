"""VRDQ on the paper's kind of MDP: error against samples per agent and against total samples, and the
messages sent, for 1 to 100 agents on ring, complete and time-varying graphs; the paper's fixed
schedule and per-sample consensus Q-learning beside it.

    python examples/vrdq_sweep.py --out docs/figures/vrdq --seeds 5 --samples 100000   # ~15 min

The MDP: 10 states, 5 actions, gamma 0.9, transitions uniform on the simplex, exact rewards uniform in
[0, 1] (``envs.tabular.random_mdp``). Error: the mean over agents of max |Q_i - Q*| (the paper's E_K),
Q* by value iteration. Writes ``OUT.json`` (settings, every run's curve, the goals) and ``OUT.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from embodyrl.algos import vrdq
from embodyrl.algos.vrdq import per_sample
from embodyrl.envs.tabular import q_star, random_mdp

AGENTS = (1, 5, 10, 20, 100)
GRAPHS = {"complete": {"topology": "complete"}, "ring": {"topology": "ring"},
          "time_varying": {"time_varying": True}}


def geometric_runs(mdp, truth, samples: int, seeds: int) -> dict:
    """Per graph and N: the schedule's samples and messages, and each seed's error curve."""
    out = {}
    for graph, kind in GRAPHS.items():
        out[graph] = {}
        for n in AGENTS:
            curves, messages = [], []
            for seed in range(seeds):
                _, trace, plan = vrdq.run(mdp, vrdq.VRDQConfig(num_agents=n, **kind), samples, seed=seed,
                                          q_star=truth)
                curves.append([round(e, 7) for e in trace.error])
                messages.append(trace.messages)
            out[graph][str(n)] = {"samples": trace.samples, "rounds_per_epoch": list(plan.rounds),
                                  "messages": [int(np.mean(m)) for m in zip(*messages, strict=True)],
                                  "error_by_seed": curves, "step": plan.step}
            print(f"{graph:>12} N={n:<3} error {np.mean([c[-1] for c in curves]):.5f} "
                  f"messages {out[graph][str(n)]['messages'][-1]:,}", flush=True)
    return out


def fixed_runs(mdp, truth, samples: int, seeds: int) -> dict:
    """The paper's Theorem 1 schedule for the same budget: final error and messages."""
    out = {}
    for graph in ("complete", "ring"):
        out[graph] = {}
        for n in AGENTS:
            finals, plan, trace = [], None, None
            for seed in range(seeds):
                _, trace, plan = vrdq.run(mdp, vrdq.VRDQConfig(num_agents=n, epochs="fixed", topology=graph),
                                          samples, seed=seed, q_star=truth)
                finals.append(round(trace.error[-1], 7))
            out[graph][str(n)] = {"epochs": plan.epochs, "epoch_samples": plan.samples[0],
                                  "rounds_per_epoch": plan.rounds[-1], "step": plan.step,
                                  "messages": trace.messages[-1], "final_error_by_seed": finals}
    return out


def per_sample_runs(mdp, truth, samples: int, seeds: int, agents=(1, 5, 100)) -> dict:
    """Per-sample consensus Q-learning (one phase of 3 rounds per sample), complete graph."""
    out = {}
    for n in agents:
        curves, messages = [], 0
        for seed in range(seeds):
            state, err = per_sample.run(mdp, per_sample.PerSampleConfig(num_agents=n, consensus_rounds=3,
                                                                        topology="complete"),
                                        samples, seed=seed, q_star=truth)
            curves.append([round(e, 7) for e in err[9::10]])
            messages = int(state.messages)
        out[str(n)] = {"samples": list(range(10, samples + 1, 10)), "error_by_seed": curves, "messages": messages}
        print(f"per-sample N={n:<3} error {np.mean([c[-1] for c in curves]):.5f} messages {messages:,}", flush=True)
    return out


def band(curves) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error over seeds."""
    a = np.asarray(curves)
    return a.mean(0), a.std(0, ddof=1) / np.sqrt(len(a)) if len(a) > 1 else np.zeros(a.shape[1])


def at_samples(run: dict, target: int) -> int:
    """The index of the first epoch end with at least ``target`` samples per agent."""
    return next(i for i, s in enumerate(run["samples"]) if s >= target)


def goals(runs: dict, samples: int) -> dict:
    """Each goal per graph, measured at equal samples per agent."""
    ideal = float(np.sqrt(100 / 5))
    out = {"gain_100_over_5_ideal": ideal, "by_graph": {}}
    for graph, by_n in runs.items():
        final = {n: float(np.mean([c[-1] for c in r["error_by_seed"]])) for n, r in by_n.items()}
        gain = final["5"] / final["100"]
        one_mean, one_se = band(by_n["1"]["error_by_seed"])
        worse = {}
        for n, r in by_n.items():
            if n == "1":
                continue
            mean, se = band(r["error_by_seed"])
            # after epoch 0, beyond seed noise and float32 rounding (epoch 1's Q is R for every N)
            noise = np.maximum(2 * np.sqrt(se[1:] ** 2 + one_se[1:] ** 2), 1e-6 * one_mean[1:])
            beyond = mean[1:] - one_mean[1:] > noise
            worse[n] = int(beyond.sum())
        m = {s: by_n["10"]["messages"][at_samples(by_n["10"], s)] for s in (10**3, 10**4, 10**5) if s <= samples}
        decades = [m[b] - m[a] for a, b in zip(sorted(m), sorted(m)[1:], strict=False)]
        out["by_graph"][graph] = {
            "final_error": final, "gain_100_over_5": gain,
            "gain_within_1.5x_of_sqrt20": ideal / 1.5 <= gain <= ideal * 1.5,
            "epochs_worse_than_one_agent_beyond_noise": worse,
            "never_worse_than_one_agent": not any(worse.values()),
            "messages_10_agents_at": {str(k): v for k, v in m.items()},
            "messages_per_decade": decades,
            "messages_logarithmic": len(decades) < 2 or decades[-1] <= 1.2 * decades[-2],
        }
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["geometric"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    (a, b), (c, d) = axes
    for i, (n, r) in enumerate(runs["complete"].items()):
        x = np.asarray(r["samples"])
        mean, se = band(r["error_by_seed"])
        for ax, scale in ((a, 1), (b, int(n))):
            ax.plot(x * scale, mean, color=f"C{i}", label=f"N = {n}")
            ax.fill_between(x * scale, mean - 2 * se, mean + 2 * se, color=f"C{i}", alpha=0.25, lw=0)
    ps = result["per_sample"]
    for i, (n, r) in enumerate(ps.items()):
        mean, _ = band(r["error_by_seed"])
        a.plot(r["samples"], mean, color=f"C{list(runs['complete']).index(n)}", ls=":", lw=1,
               label=f"per-sample, N = {n}" if i == 0 else f"per-sample, N = {n}")
    a.set(xscale="log", yscale="log", xlabel="samples per (s, a) per agent", ylabel="mean over agents of max |Q - Q*|",
          title="VRDQ, complete graph (bands: 2 standard errors, seeds)")
    b.set(xscale="log", yscale="log", xlabel="total samples per (s, a), all agents",
          title="against total samples: on N = 1's curve = linear speedup")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    for i, (graph, by_n) in enumerate(runs.items()):
        r = by_n["10"]
        c.plot(r["samples"], r["messages"], color=f"C{i}", label=f"VRDQ, {graph}, N = 10")
    x = np.asarray(runs["complete"]["10"]["samples"])
    c.plot(x, 3 * 90 * x, color="grey", ls=":", label="per-sample, complete, 3 rounds a sample")
    c.set(xscale="log", yscale="log", xlabel="samples per (s, a) per agent", ylabel="messages sent (all agents)",
          title="communication")
    c.legend(fontsize=7)
    agents = np.array([int(n) for n in runs["complete"]])
    for i, (graph, by_n) in enumerate(runs.items()):
        finals = [np.mean([cv[-1] for cv in r["error_by_seed"]]) for r in by_n.values()]
        d.plot(agents, finals, marker="o", color=f"C{i}", label=f"VRDQ, {graph}")
    fixed = result["fixed"]["complete"]
    d.plot(agents, [np.mean(r["final_error_by_seed"]) for r in fixed.values()], marker="s", color="k", ls="--",
           label="paper's fixed schedule, complete")
    ref = np.mean([cv[-1] for cv in runs["complete"]["1"]["error_by_seed"]])
    d.plot(agents, ref / np.sqrt(agents), color="grey", ls=":", label="1 / sqrt(N)")
    d.set(xscale="log", yscale="log", xlabel="agents N", ylabel="final error",
          title=f"after {result['samples']:,} samples per agent")
    d.legend(fontsize=7)
    for ax in axes.flat:
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="vrdq")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=100_000, help="per (s, a) per agent (the paper's T)")
    parser.add_argument("--per-sample-samples", type=int, default=10_000,
                        help="budget of the per-sample comparison (one consensus phase per sample)")
    parser.add_argument("--per-sample-agents", type=int, nargs="+", default=[1, 5, 100])
    args = parser.parse_args(argv)
    started = time.monotonic()
    mdp = random_mdp(seed=0)
    truth = q_star(mdp)
    result = {"mdp": "random_mdp(10 states, 5 actions, gamma 0.9, Dirichlet(1) transitions, exact rewards "
                     "U[0, 1], seed 0)", "samples": args.samples, "seeds": args.seeds,
              "schedule": "geometric epochs, growth 1 + (1 - gamma) / 2, first epoch 8 samples, step 1, "
                          "the paper's L capped at the epoch's samples",
              "geometric": geometric_runs(mdp, truth, args.samples, args.seeds),
              "fixed": fixed_runs(mdp, truth, args.samples, args.seeds),
              "per_sample": per_sample_runs(mdp, truth, args.per_sample_samples, args.seeds,
                                            args.per_sample_agents)}
    result["goals"] = goals(result["geometric"], args.samples)
    result["wall_s"] = round(time.monotonic() - started, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, separators=(",", ":")) + "\n")
    plot(result, out.with_suffix(".png"))
    print(json.dumps(result["goals"], indent=1))


if __name__ == "__main__":
    main()
