import multiprocessing as mp
import socket

import jax
import numpy as np
import pytest

from embodyrl.algos import vrdq
from embodyrl.algos.vrdq.learning import sample_agent
from embodyrl.envs.tabular import bellman, grid_world, q_star

MDP = grid_world(reward_noise=0.5)
QSTAR = q_star(MDP)


def test_q_star_is_the_fixed_point():
    np.testing.assert_allclose(bellman(MDP, QSTAR), QSTAR, atol=1e-10)


def test_empirical_operator_tends_to_the_exact_operator():
    q = np.random.default_rng(0).normal(size=QSTAR.shape)
    next_states, rewards = sample_agent(MDP.P, MDP.R, MDP.reward_noise, 20_000, jax.random.key(0), 0, 0)
    T = np.asarray(vrdq.empirical_operator(q, next_states, rewards, MDP.discount))
    np.testing.assert_allclose(T, bellman(MDP, q), atol=0.05)


@pytest.mark.parametrize("topology", vrdq.TOPOLOGIES)
def test_mixing_matrices_are_doubly_stochastic_and_reach_the_average(topology):
    A = vrdq.adjacency(topology, 6, np.random.default_rng(1))
    W = vrdq.metropolis(A)
    np.testing.assert_allclose(W.sum(0), 1)
    np.testing.assert_allclose(W.sum(1), 1)
    assert (W >= 0).all() and vrdq.spectral_gap(W) > 0
    y = np.random.default_rng(2).normal(size=(6, 3))
    mixed = np.asarray(vrdq.mix(W, y, 500))
    np.testing.assert_allclose(mixed, np.broadcast_to(y.mean(0), y.shape), atol=1e-4)  # float32


def final_error(agents, seeds=(0, 1, 2), epochs=300, topology="ring"):
    errs = []
    for seed in seeds:
        cfg = vrdq.VRDQConfig(num_agents=agents, samples_per_epoch=1, consensus_rounds=4, topology=topology)
        _, err = vrdq.run(MDP, cfg, epochs, seed=seed, q_star=QSTAR)
        errs.append(np.mean(err[-20:]))
    return float(np.mean(errs))


def test_converges_toward_q_star_and_more_agents_help():
    initial = float(np.max(np.abs(QSTAR)))
    one, four = final_error(1), final_error(4)
    assert four < 0.35 * initial
    assert four < 0.7 * one  # same samples per agent, four agents' operators averaged


def test_message_count_is_rounds_times_degrees():
    cfg = vrdq.VRDQConfig(num_agents=5, consensus_rounds=3, topology="ring")
    state, _ = vrdq.run(MDP, cfg, 10, seed=0)
    assert int(state.messages) == 10 * 3 * 10  # 5 agents, 2 neighbours each
    star = vrdq.VRDQConfig(num_agents=5, consensus_rounds=2, topology="star")
    state, _ = vrdq.run(MDP, star, 4, seed=0)
    assert int(state.messages) == 4 * 2 * 8


def test_time_varying_graphs_converge_too():
    cfg = vrdq.VRDQConfig(num_agents=6, consensus_rounds=2, topology="random", time_varying=True)
    _, err = vrdq.run(MDP, cfg, 200, seed=3, q_star=QSTAR)
    assert err[-1] < 0.5 * err[0]


def _agent(agent, W, endpoints, cfg, epochs, out):
    from embodyrl.learner.consensus import run_agent

    q, stats = run_agent(agent, W, endpoints, MDP, cfg, epochs, seed=7)
    out.put((agent, q, stats["messages_out"]))


def test_agents_in_separate_processes_match_the_simulation():
    n, epochs = 4, 15
    cfg = vrdq.VRDQConfig(num_agents=n, consensus_rounds=2, topology="ring")
    W = vrdq.metropolis(vrdq.adjacency("ring", n))
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    endpoints = {i: f"tcp://127.0.0.1:{p}" for i, p in enumerate(ports)}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_agent, args=(i, W, endpoints, cfg, epochs, out)) for i in range(n)]
    for p in procs:
        p.start()
    try:
        results = {a: (q, m) for a, q, m in (out.get(timeout=180) for _ in range(n))}
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    state = vrdq.init(jax.random.key(7), MDP.num_states, MDP.num_actions, cfg)
    epoch = vrdq.make_epoch(MDP.P, MDP.R, MDP.discount, MDP.reward_noise, cfg)
    for _ in range(epochs):
        state = epoch(state, W, 0)
    for a in range(n):
        np.testing.assert_allclose(results[a][0], np.asarray(state.q[a]), atol=1e-4)
        assert results[a][1] == epochs * 2 * 2  # rounds x neighbours
