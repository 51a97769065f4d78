import multiprocessing as mp
import socket

import jax
import numpy as np
import pytest

from embodyrl.algos import vrdq
from embodyrl.algos.vrdq import per_sample, schedule
from embodyrl.algos.vrdq.learning import draw, refined_operator
from embodyrl.envs.tabular import bellman, grid_world, q_star, random_mdp

MDP = grid_world(reward_noise=0.5)
QSTAR = q_star(MDP)
PAPER_MDP = random_mdp(seed=0)
PAPER_QSTAR = q_star(PAPER_MDP)


def test_q_star_is_the_fixed_point():
    np.testing.assert_allclose(bellman(MDP, QSTAR), QSTAR, atol=1e-10)


def test_empirical_operators_tend_to_the_exact_operator():
    q = np.random.default_rng(0).normal(size=QSTAR.shape)
    next_states, rewards = per_sample.sample_agent(MDP.P, MDP.R, MDP.reward_noise, 20_000, jax.random.key(0), 0, 0)
    T = np.asarray(per_sample.empirical_operator(q, next_states, rewards, MDP.discount))
    np.testing.assert_allclose(T, bellman(MDP, q), atol=0.05)
    counts, reward = draw(MDP, 20_000, seed=0, epoch=0, agent=0)
    assert (counts.sum(-1) == 20_000).all()
    np.testing.assert_allclose(np.asarray(refined_operator(q, counts, reward, MDP.discount)), bellman(MDP, q),
                               atol=0.05)


@pytest.mark.parametrize("topology", vrdq.TOPOLOGIES)
def test_mixing_matrices_are_doubly_stochastic_and_reach_the_average(topology):
    A = vrdq.adjacency(topology, 6, np.random.default_rng(1))
    W = vrdq.metropolis(A)
    np.testing.assert_allclose(W.sum(0), 1)
    np.testing.assert_allclose(W.sum(1), 1)
    assert (W >= 0).all() and vrdq.spectral_gap(W) > 0
    y = np.random.default_rng(2).normal(size=(6, 3))
    mixed = np.asarray(per_sample.mix(W, y, 500))
    np.testing.assert_allclose(mixed, np.broadcast_to(y.mean(0), y.shape), atol=1e-4)  # float32


def per_sample_error(agents, seeds=(0, 1, 2), epochs=300, topology="ring"):
    errs = []
    for seed in seeds:
        cfg = per_sample.PerSampleConfig(num_agents=agents, samples_per_epoch=1, consensus_rounds=4,
                                         topology=topology)
        _, err = per_sample.run(MDP, cfg, epochs, seed=seed, q_star=QSTAR)
        errs.append(np.mean(err[-20:]))
    return float(np.mean(errs))


def test_per_sample_consensus_converges_toward_q_star_and_more_agents_help():
    initial = float(np.max(np.abs(QSTAR)))
    one, four = per_sample_error(1), per_sample_error(4)
    assert four < 0.35 * initial
    assert four < 0.7 * one  # same samples per agent, four agents' operators averaged


def test_per_sample_message_count_is_rounds_times_degrees():
    cfg = per_sample.PerSampleConfig(num_agents=5, consensus_rounds=3, topology="ring")
    state, _ = per_sample.run(MDP, cfg, 10, seed=0)
    assert int(state.messages) == 10 * 3 * 10  # 5 agents, 2 neighbours each: one phase per sample


# VRDQ as the paper states it


def test_fixed_schedule_is_the_papers_theorem_1():
    N, T, gamma = 10, 100_000, 0.9
    plan = schedule.fixed(T, N, gamma, rho=0.5)
    K = int(np.ceil(np.log(N * T) / (1 - gamma)))
    assert plan.epochs == K and set(plan.samples) == {T // K}
    assert plan.step == pytest.approx(np.log(N * T) / ((1 - gamma) * K))
    L = int(np.ceil(np.log(N**1.5 * np.sqrt(T) / np.sqrt(1 - gamma)) / np.log(2)))
    assert plan.rounds == (0,) + (L,) * (K - 1)  # nothing to diffuse in the first epoch


def test_geometric_epochs_spend_the_budget_in_logarithmically_many_epochs():
    for T in (10**3, 10**4, 10**5, 10**6):
        plan = schedule.geometric(T, 5, 0.9, rho=0.0)
        assert sum(plan.samples) == T
        assert all(a <= b for a, b in zip(plan.samples[:-2], plan.samples[1:-1], strict=True))  # epochs grow
        assert plan.rounds[0] == 0 and set(plan.rounds[1:]) == {1}  # complete graph: one round is exact
    epochs = [schedule.geometric(10**e, 5, 0.9, rho=0.0).epochs for e in (3, 4, 5, 6)]
    steps = np.diff(epochs)  # a constant number of epochs per tenfold samples
    assert steps.max() - steps.min() <= 4 and 40 <= steps.mean() <= 55  # log(10) / log(1.05) = 47 (ceil early)


def test_rounds_are_capped_by_the_epoch_and_zero_alone():
    assert schedule.rounds_for(1, 10**6, 0.9, rho=0.99) == 0
    plan = schedule.geometric(2_000, 100, 0.9, rho=0.9987)  # a ring of 100: thousands of rounds wanted
    assert all(L <= H for L, H in zip(plan.rounds, plan.samples, strict=True))


def test_message_count_follows_the_epoch_schedule():
    cfg = vrdq.VRDQConfig(num_agents=5, topology="ring")
    _, trace, plan = vrdq.run(PAPER_MDP, cfg, 3_000, seed=0)
    assert trace.rounds[-1] == sum(plan.rounds)
    assert trace.messages[-1] == sum(plan.rounds) * 10  # 5 agents, 2 neighbours each, every round
    assert trace.samples[-1] == 3_000 and plan.epochs < 100  # against 3,000 phases per sample
    star = vrdq.VRDQConfig(num_agents=5, topology="star", epochs="fixed")
    _, trace, plan = vrdq.run(PAPER_MDP, star, 3_000, seed=0)
    assert trace.messages[-1] == sum(plan.rounds) * 8


def test_agents_on_a_complete_graph_equal_one_agent_with_all_their_samples():
    """Exact averaging: N agents' diffused operators are the operator of their pooled samples."""
    for n in (2, 5):
        team, _, _ = vrdq.run(PAPER_MDP, vrdq.VRDQConfig(num_agents=n, topology="complete"), 2_000, seed=3)
        alone, _, _ = vrdq.run(PAPER_MDP, vrdq.VRDQConfig(num_agents=1, pooled=n, topology="complete",
                                                          max_rounds=1), 2_000, seed=3)
        for i in range(n):
            np.testing.assert_allclose(np.asarray(team.q[i]), np.asarray(alone.q[0]), rtol=1e-5, atol=1e-5)
    lone, _, _ = vrdq.run(PAPER_MDP, vrdq.VRDQConfig(num_agents=1), 2_000, seed=3)
    assert not np.allclose(np.asarray(lone.q[0]), np.asarray(alone.q[0]), atol=1e-4)  # the samples matter


def final_errors(agents, seeds=range(5), budget=20_000, topology="complete"):
    return [vrdq.run(PAPER_MDP, vrdq.VRDQConfig(num_agents=agents, topology=topology), budget, seed=s,
                     q_star=PAPER_QSTAR)[1].error[-1] for s in seeds]


def test_more_agents_lower_the_error_at_equal_samples_per_agent():
    means = [np.mean(final_errors(n)) for n in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(means, means[1:], strict=False)), means
    assert means[0] / means[3] > 2.0  # sqrt(8) = 2.8 at a linear speedup


def test_time_varying_graphs_converge_and_count_each_rounds_edges():
    cfg = vrdq.VRDQConfig(num_agents=6, time_varying=True)
    _, trace, plan = vrdq.run(PAPER_MDP, cfg, 3_000, seed=3, q_star=PAPER_QSTAR)
    assert trace.error[-1] < 0.05 * trace.error[0]
    per_round = trace.messages[-1] / trace.rounds[-1]
    assert 2 * 5 <= per_round <= 6 * 5  # a connected graph of 6 each round: 5 to 15 edges, both ways


def _agent(agent, W, endpoints, cfg, budget, out):
    from embodyrl.learner.consensus import run_agent

    q, stats = run_agent(agent, W, endpoints, PAPER_MDP, cfg, budget, seed=7)
    out.put((agent, q, stats["messages_out"]))


def test_agents_in_separate_processes_match_the_simulation():
    n, budget = 4, 600
    cfg = vrdq.VRDQConfig(num_agents=n, topology="ring", max_rounds=3)
    W = vrdq.metropolis(vrdq.adjacency("ring", n))
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    endpoints = {i: f"tcp://127.0.0.1:{p}" for i, p in enumerate(ports)}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_agent, args=(i, W, endpoints, cfg, budget, out)) for i in range(n)]
    for p in procs:
        p.start()
    try:
        results = {a: (q, m) for a, q, m in (out.get(timeout=180) for _ in range(n))}
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    state, trace, plan = vrdq.run(PAPER_MDP, cfg, budget, seed=7)
    for a in range(n):
        np.testing.assert_allclose(results[a][0], np.asarray(state.q[a]), atol=1e-4)
        assert results[a][1] == sum(plan.rounds) * 2  # each round, to each of its 2 neighbours
    assert trace.messages[-1] == sum(results[a][1] for a in range(n))
