"""Distributed Q-learning: VRDQ agents in separate processes reach consensus over peer links.

Each agent is its own process with its own samples of a random MDP (the VRDQ
paper's kind: 10 states, 5 actions, gamma 0.9); every epoch it diffuses its
refined Bellman estimate with its neighbours on a ring (ZeroMQ peer links,
no centre) and updates its Q once. At the end every agent's Q is compared
with Q* from value iteration, and with what one agent alone reaches with the
same samples per agent::

    python examples/distributed_q_learning.py --agents 4 --samples 20000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket

import numpy as np

from embodyrl.algos import vrdq
from embodyrl.envs.tabular import q_star, random_mdp


def free_ports(n: int) -> list[int]:
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


def agent_process(agent, W, endpoints, config, samples, seed, out) -> None:
    from embodyrl.learner.consensus import run_agent

    q, stats = run_agent(agent, W, endpoints, random_mdp(seed=seed), config, samples, seed)
    out.put((agent, q, stats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--samples", type=int, default=20_000, help="per (s, a) per agent")
    parser.add_argument("--max-rounds", type=int, default=None, help="cap on consensus rounds per epoch")
    parser.add_argument("--topology", default="ring", choices=vrdq.TOPOLOGIES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    mdp = random_mdp(seed=args.seed)
    truth = q_star(mdp)
    config = vrdq.VRDQConfig(num_agents=args.agents, topology=args.topology, max_rounds=args.max_rounds)
    A = vrdq.adjacency(args.topology, args.agents, np.random.default_rng(args.seed))
    W = vrdq.metropolis(A)
    endpoints = {i: f"tcp://127.0.0.1:{p}" for i, p in enumerate(free_ports(args.agents))}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=agent_process, args=(i, W, endpoints, config, args.samples, args.seed, out))
             for i in range(args.agents)]
    for p in procs:
        p.start()
    try:
        results = sorted(out.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    _, alone, _ = vrdq.run(mdp, vrdq.VRDQConfig(num_agents=1), args.samples, seed=args.seed, q_star=truth)
    print(f"{args.agents} agents on a {args.topology}, {args.samples} samples per (s, a) per agent")
    for agent, q, stats in results:
        print(f"  agent {agent}: max |Q - Q*| = {np.max(np.abs(q - truth)):.4f}, "
              f"{stats['messages_out']} messages, {stats['bytes_out'] / 1e3:.0f} kB sent")
    print(f"  one agent alone: max |Q - Q*| = {alone.error[-1]:.4f}")


if __name__ == "__main__":
    main()
