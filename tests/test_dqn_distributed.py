"""Neural distributed Q-learning: consensus over real peer links shrinks the spread of parameters."""

import threading

import jax
import numpy as np
import pytest

from embodyrl.algos import dqn
from embodyrl.algos.dqn.distributed import (
    RunConfig,
    _flat,
    consensus_round,
    parameter_spread,
)
from embodyrl.algos.vrdq.graphs import adjacency, metropolis
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.learner.consensus import run_team
from embodyrl.transport.peers import PeerLink

OBS = DictSpec.of(ArraySpec("observation", (4,), np.float32))
ACT = ArraySpec("action", (), np.int64, 0, 1)


def _learners_params(n):
    config = dqn.DQNConfig(hidden_sizes=(16,))
    return [_flat(dqn.init(jax.random.key(i), OBS, ACT, config)[1]) for i in range(n)]


def _consensus(W, flats, rounds):
    """Every learner in its own thread with its own PeerLink (real sockets), ``rounds`` rounds."""
    n = len(flats)
    links = [PeerLink(i) for i in range(n)]
    for i, link in enumerate(links):
        link.connect({int(j): links[j].endpoint for j in np.flatnonzero(W[i]) if j != i})
    out, errors = list(flats), []

    def run(i):
        try:
            for r in range(rounds):
                out[i], _ = consensus_round(links[i].exchange_fn(20.0), r, W, i, out[i])
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for link in links:
        link.close()
    assert not errors and not any(t.is_alive() for t in threads)
    return out, [link.stats for link in links]


def test_one_round_on_the_complete_graph_is_the_exact_average():
    flats = _learners_params(3)
    W = metropolis(adjacency("complete", 3))
    mixed, stats = _consensus(W, flats, rounds=1)
    assert parameter_spread(flats) > 0.1
    assert parameter_spread(mixed) < 1e-6
    for k in flats[0]:
        np.testing.assert_allclose(mixed[0][k], np.mean([f[k] for f in flats], 0), rtol=1e-5, atol=1e-6)
    assert all(s.messages_out == 2 for s in stats)  # one message per neighbour per round


def test_ring_rounds_shrink_the_spread_step_by_step():
    flats = _learners_params(5)
    W = metropolis(adjacency("ring", 5))
    spreads = [parameter_spread(flats)]
    current = flats
    for _ in range(3):
        current, _ = _consensus(W, current, rounds=1)
        spreads.append(parameter_spread(current))
    assert spreads[0] > spreads[1] > spreads[2] > spreads[3]
    # the average is preserved (W is doubly stochastic)
    key = sorted(flats[0])[0]
    np.testing.assert_allclose(np.mean([c[key] for c in current], 0), np.mean([f[key] for f in flats], 0),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_two_spawned_learners_train_on_cartpole_and_agree():
    run = RunConfig(num_envs=2, max_env_steps=1200, epoch_steps=400, learning_starts=200, eval_episodes=2,
                    target_return=1e9, round_timeout_s=120.0)
    results = run_team(2, dqn.DQNConfig(hidden_sizes=(16,), updates_per_call=4), run, timeout_s=600)
    for r in results:
        assert [h["env_steps"] for h in r["history"]] == [400, 800, 1200]
        assert r["history"][-1]["updates"] > 0 and r["history"][-1]["messages_out"] == 3 * 2  # params + score
        assert r["history"][0]["spread_before"] > 0
    # the complete graph: both hold the same parameters after each epoch, so they score alike
    assert results[0]["history"][-1]["eval_return"] == results[1]["history"][-1]["eval_return"]
    assert results[0]["report_return"] == results[1]["report_return"]  # and on the same fresh seeds


def test_reported_return_comes_from_seeds_the_stopping_rule_never_saw(monkeypatch):
    """The stopping rule's episodes select when to stop, so the reported figure uses other seeds."""
    from embodyrl.algos.dqn import distributed

    calls = []

    def recording(env_id, networks, params, episodes, seed):
        calls.append(range(seed, seed + episodes))
        return real(env_id, networks, params, episodes, seed)

    real = distributed.evaluate
    monkeypatch.setattr(distributed, "evaluate", recording)
    run = RunConfig(num_envs=2, max_env_steps=200, epoch_steps=100, learning_starts=50, eval_episodes=3,
                    report_episodes=4, target_return=1e9)
    result = distributed.run_learner(0, np.ones((1, 1)), dqn.DQNConfig(hidden_sizes=(8,)), run)
    *stopping, report = calls
    assert len(stopping) == 2 and len(report) == 4
    assert not set(report) & set().union(*map(set, stopping))
    assert result["report_return"] >= 1  # CartPole pays 1 a step: a real evaluation ran
