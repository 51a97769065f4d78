"""DQN's numpy export (argmax head, epsilon-greedy) against the JAX Q-network: the HAL parity test."""

import jax
import numpy as np
import pytest

from embodyrl.algos import dqn
from embodyrl.cli.export import export_dqn
from embodyrl.hal import runtime
from embodyrl.hal.specs import ArraySpec, DictSpec

OBS = DictSpec.of(ArraySpec("observation", (4,), np.float32), ArraySpec("extra", (2, 2), np.float64))
ACT = ArraySpec("action", (), np.int64, 0, 4)


def _random_q(hidden, seed):
    networks, params = dqn.make_networks(OBS, ACT, hidden, jax.random.key(seed))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda p: rng.normal(0, 1.0 / np.sqrt(p.shape[0]), p.shape).astype(np.float32), params)
    return networks, params


def _observations(rng, n):
    return {"observation": rng.normal(size=(n, 4)).astype(np.float32), "extra": rng.normal(size=(n, 2, 2))}


@pytest.mark.parametrize(("hidden", "seed"), [((16,), 0), ((32, 16), 1), ((), 2)])
def test_greedy_actions_equal_the_jax_argmax(hidden, seed, tmp_path):
    networks, params = _random_q(hidden, seed)
    json_path, _ = runtime.save(tmp_path / "q", *export_dqn(networks, params))
    policy = runtime.load(json_path)
    obs = _observations(np.random.default_rng(seed + 5), 256)
    expected = np.asarray(networks.q_values(params, obs)).argmax(-1)
    got = policy.mean_action(obs)
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) > 1  # the observations matter
    one = {k: v[0] for k, v in obs.items()}
    action, extras = policy.act(one, explore=False)
    assert action.dtype == np.int64 and action.shape == () and int(action) == expected[0] and extras == {}


def test_epsilon_greedy_explores_at_the_given_rate_over_every_action():
    networks, params = _random_q((8,), 3)
    policy = runtime.NumpyPolicy(*export_dqn(networks, params, epsilon=0.4), seed=0)
    one = {k: v[0] for k, v in _observations(np.random.default_rng(4), 1).items()}
    greedy = int(policy.mean_action(one))
    actions = np.array([int(policy.act(one, explore=True)[0]) for _ in range(5000)])
    # greedy with probability 0.6 + 0.4/5; each other action 0.4/5, the maximum included
    assert np.mean(actions == greedy) == pytest.approx(0.68, abs=0.03)
    assert set(actions) == set(range(5))


def test_a_continuous_action_spec_is_refused_for_argmax():
    networks, params = _random_q((8,), 5)
    graph, arrays = export_dqn(networks, params)
    graph["action_spec"] = ArraySpec("action", (1,), np.float32, -1.0, 1.0).to_msg()
    with pytest.raises(runtime.ExportError, match="argmax"):
        runtime.NumpyPolicy(graph, arrays)
