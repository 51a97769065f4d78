"""Distributed Q-learning: VRDQ agents in separate processes reach consensus over peer links.

Each agent is its own process with its own samples of a small grid-world MDP;
every epoch it applies its empirical Bellman operator, mixes the result with
its neighbours on a ring for a few rounds (ZeroMQ peer links, no centre), and
relaxes toward it. At the end every agent's Q is compared with Q* from value
iteration, and with what one agent alone reaches on the same samples::

    python examples/distributed_q_learning.py --agents 4 --epochs 200
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket

import numpy as np

from embodyrl.algos import vrdq
from embodyrl.envs.tabular import grid_world, q_star


def free_ports(n: int) -> list[int]:
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


def agent_process(agent, W, endpoints, config, epochs, seed, out) -> None:
    from embodyrl.learner.consensus import run_agent

    q, stats = run_agent(agent, W, endpoints, grid_world(), config, epochs, seed)
    out.put((agent, q, stats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="consensus rounds per epoch")
    parser.add_argument("--topology", default="ring", choices=vrdq.TOPOLOGIES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    mdp = grid_world()
    truth = q_star(mdp)
    config = vrdq.VRDQConfig(num_agents=args.agents, consensus_rounds=args.rounds, topology=args.topology)
    A = vrdq.adjacency(args.topology, args.agents, np.random.default_rng(args.seed))
    W = vrdq.metropolis(A)
    endpoints = {i: f"tcp://127.0.0.1:{p}" for i, p in enumerate(free_ports(args.agents))}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=agent_process, args=(i, W, endpoints, config, args.epochs, args.seed, out))
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
    _, alone = vrdq.run(mdp, vrdq.VRDQConfig(num_agents=1), args.epochs, seed=args.seed, q_star=truth)
    print(f"{args.agents} agents on a {args.topology}, {args.rounds} rounds/epoch, {args.epochs} epochs")
    for agent, q, stats in results:
        print(f"  agent {agent}: max |Q - Q*| = {np.max(np.abs(q - truth)):.3f}, "
              f"{stats['messages_out']} messages, {stats['bytes_out'] / 1e3:.0f} kB sent")
    print(f"  one agent alone: max |Q - Q*| = {alone[-1]:.3f}")


if __name__ == "__main__":
    main()
