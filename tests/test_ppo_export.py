"""PPO's numpy export (Gaussian and categorical) against the JAX networks: the HAL parity test."""

import jax
import numpy as np
import pytest

from embodyrl.algos import ppo
from embodyrl.cli.export import export_ppo
from embodyrl.hal import params as flat_params
from embodyrl.hal import runtime
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import PolicyVersion

OBS = DictSpec.of(ArraySpec("pos", (3,), np.float32), ArraySpec("grid", (2, 2), np.float64))
CONTINUOUS = ArraySpec("action", (2,), np.float32, [-2.0, 0.0], [2.0, 1.0])
DISCRETE = ArraySpec("action", (), np.int64, 0, 3)


def _observations(rng, n):
    return {"pos": rng.normal(size=(n, 3)).astype(np.float32), "grid": rng.normal(size=(n, 2, 2))}


def _exported(spec, hidden, seed):
    config = ppo.PPOConfig(hidden_sizes=hidden, init_log_std=-1.0)
    networks, params = ppo.make_networks(OBS, spec, config, jax.random.key(seed))
    rng = np.random.default_rng(seed)  # every weight random, biases too, so nothing cancels by accident
    params = jax.tree.map(lambda p: rng.normal(0, 1.0 / np.sqrt(p.shape[0]), p.shape).astype(np.float32), params)
    if "log_std" in params:  # random but moderate, so that sampling statistics stay tight
        params["log_std"] = np.array([-1.0, -0.5], np.float32)
    actor = ppo.actor_params(params)
    return networks, actor, runtime.NumpyPolicy(*export_ppo(networks, actor, PolicyVersion(7, 2)), seed=seed)


@pytest.mark.parametrize(("hidden", "seed"), [((16,), 0), ((32, 16), 1), ((), 2)])
def test_gaussian_mean_and_log_prob_equal_jax(hidden, seed):
    networks, actor, policy = _exported(CONTINUOUS, hidden, seed)
    obs = _observations(np.random.default_rng(seed + 10), 64)
    expected = np.asarray(networks.mode(actor, obs))
    got = policy.mean_action(obs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert (np.ptp(got, axis=0) > 1e-3).all()
    one = {k: v[0] for k, v in obs.items()}
    for _ in range(20):  # the log-probability the runtime reports is JAX's of the same (unclipped) sample
        action, extras = policy._run(one, sample=True)
        jax_logp = float(networks.log_prob(actor, one, action))
        assert extras is not None and float(extras) == pytest.approx(jax_logp, rel=1e-4, abs=1e-4)


def test_gaussian_samples_match_jax_in_distribution():
    networks, actor, policy = _exported(CONTINUOUS, (16,), 3)
    one = {k: v[0] for k, v in _observations(np.random.default_rng(4), 1).items()}
    samples = np.array([policy._run(one, sample=True)[0] for _ in range(4000)])
    jax_samples = np.asarray(jax.vmap(lambda k: networks.sample(actor, one, k))(jax.random.split(jax.random.key(0), 4000)))
    np.testing.assert_allclose(samples.mean(0), jax_samples.mean(0), atol=0.03)
    np.testing.assert_allclose(samples.std(0), jax_samples.std(0), rtol=0.1)
    action, extras = policy.act(one, explore=True)
    assert CONTINUOUS.minimum[1] <= action[1] <= CONTINUOUS.maximum[1] and "log_prob" in extras


def test_categorical_mode_log_prob_and_frequencies_equal_jax():
    networks, actor, policy = _exported(DISCRETE, (16,), 5)
    obs = _observations(np.random.default_rng(6), 64)
    np.testing.assert_array_equal(policy.mean_action(obs), np.asarray(networks.mode(actor, obs)))
    one = {k: v[0] for k, v in obs.items()}
    counts = np.zeros(4)
    logps = {}
    for _ in range(3000):
        action, extras = policy.act(one, explore=True)
        assert action.dtype == np.int64 and action.shape == ()
        logps.setdefault(int(action), set()).add(round(extras["log_prob"], 5))
        counts[int(action)] += 1
    probs = np.exp(np.asarray(networks.log_prob(actor, {k: np.repeat(v[None], 4, 0) for k, v in one.items()},
                                                 np.arange(4))))
    for a, seen in logps.items():  # each action's reported log-probability is JAX's
        assert len(seen) == 1 and seen.pop() == pytest.approx(np.log(probs[a]), abs=1e-4)
    np.testing.assert_allclose(counts / counts.sum(), probs, atol=0.03)


def test_numpy_policy_follows_published_ppo_weights():
    networks, actor, policy = _exported(CONTINUOUS, (8,), 7)
    _, other, _ = _exported(CONTINUOUS, (8,), 8)
    policy.load_weights(PolicyVersion(7, 3), flat_params.flatten({"actor": jax.device_get(other)}))
    obs = _observations(np.random.default_rng(9), 8)
    np.testing.assert_allclose(policy.mean_action(obs), np.asarray(networks.mode(other, obs)), rtol=1e-5, atol=1e-5)
    assert policy.version == PolicyVersion(7, 3)


def test_a_log_std_of_the_wrong_width_is_refused_by_name():
    networks, actor, _ = _exported(CONTINUOUS, (8,), 9)
    graph, arrays = export_ppo(networks, actor)
    arrays["actor/log_std"] = np.zeros(3, np.float32)
    with pytest.raises(runtime.ExportError, match="actor/log_std"):
        runtime.NumpyPolicy(graph, arrays)


def test_a_saved_ppo_policy_exports_and_acts_like_jax(tmp_path):
    from embodyrl.cli.export import export_saved_policy
    from embodyrl.policy import save_policy

    networks, actor, _ = _exported(CONTINUOUS, (16, 8), 11)
    save_policy(tmp_path / "policy", PolicyVersion(3, 9), flat_params.flatten({"actor": jax.device_get(actor)}),
                OBS, CONTINUOUS, ppo.PPOConfig(hidden_sizes=(16, 8)))
    json_path, _ = export_saved_policy(tmp_path / "policy", tmp_path / "export" / "policy")
    policy = runtime.load(json_path)
    obs = _observations(np.random.default_rng(12), 16)
    np.testing.assert_allclose(policy.mean_action(obs), np.asarray(networks.mode(actor, obs)), rtol=1e-5, atol=1e-5)
    assert policy.version == PolicyVersion(3, 9) and policy.graph["algo"] == "ppo"
