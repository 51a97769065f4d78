import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import ppo
from embodyrl.algos.ppo.losses import value_loss
from embodyrl.hal.specs import ArraySpec, DictSpec

OBS = DictSpec.of(ArraySpec("x", (3,), np.float32))
CONTINUOUS = ArraySpec("action", (2,), np.float32, -2.0, 2.0)
DISCRETE = ArraySpec("action", (), np.int64, 0, 3)
CONFIG = ppo.PPOConfig(hidden_sizes=(16,), epochs=2, minibatches=4)


def rollout(rng, T=16, B=3, terminate_at=None):
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    discounts = np.full((T, B), 0.9, np.float32)
    if terminate_at is not None:
        discounts[terminate_at, 0] = 0.0
    return rewards, values, discounts, rng.normal(size=B).astype(np.float32)


def test_gae_scan_equals_the_loop():
    rng = np.random.default_rng(0)
    args = rollout(rng, terminate_at=5)
    for a, b in zip(ppo.gae(*args, 0.95), ppo.gae_loop(*args, 0.95), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_gae_by_hand_with_lambda_one_is_the_discounted_return():
    rewards = np.array([1.0, 2.0, 3.0], np.float32)[:, None]
    values = np.zeros((3, 1), np.float32)
    discounts = np.array([0.5, 0.5, 0.0], np.float32)[:, None]  # terminates after the last step
    adv, ret = ppo.gae(rewards, values, discounts, np.array([100.0], np.float32), 1.0)
    np.testing.assert_allclose(ret[:, 0], [1 + 0.5 * (2 + 0.5 * 3), 2 + 0.5 * 3, 3])  # no bootstrap past termination


def test_vtrace_scan_equals_its_definition():
    rng = np.random.default_rng(1)
    args = rollout(rng, terminate_at=7)
    log_rhos = rng.normal(size=(16, 3)).astype(np.float32) * 0.5
    for a, b in zip(ppo.vtrace(*args, log_rhos, 1.0, 1.0), ppo.vtrace_loop(*args, log_rhos, 1.0, 1.0), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_on_policy_vtrace_is_lambda_one_return():
    rng = np.random.default_rng(2)
    args = rollout(rng)
    vs, _ = ppo.vtrace(*args, np.zeros((16, 3), np.float32))
    _, returns = ppo.gae(*args, 1.0)
    np.testing.assert_allclose(vs, returns, rtol=1e-5, atol=1e-5)


def test_clipped_surrogate_matches_the_formula():
    log_ratio = jnp.log(jnp.array([0.5, 1.0, 1.5, 1.5]))
    adv = jnp.array([1.0, -1.0, 1.0, -1.0])
    loss, frac = ppo.clipped_surrogate(log_ratio, adv, 0.2)
    expected = -np.mean([min(0.5, 0.8), -1.0, min(1.5, 1.2), min(-1.5, -1.2)])
    assert float(loss) == pytest.approx(expected)
    assert float(frac) == pytest.approx(0.75)


def test_value_clipping_takes_the_worse_error():
    v = value_loss(jnp.array([2.0]), jnp.array([0.0]), jnp.array([2.0]), 0.5)
    assert float(v) == pytest.approx(0.5 * 1.5**2)  # the clipped value 0.5 misses the return by 1.5


def test_effective_sample_size():
    assert float(ppo.effective_sample_size(jnp.zeros(10))) == pytest.approx(10)
    assert float(ppo.effective_sample_size(jnp.array([0.0] + [-50.0] * 9))) == pytest.approx(1, abs=1e-6)


@pytest.mark.parametrize("spec", [CONTINUOUS, DISCRETE])
def test_update_improves_the_advantage_weighted_likelihood(spec):
    networks, state = ppo.init(jax.random.key(0), OBS, spec, CONFIG)
    key = jax.random.key(1)
    T, B = 32, 8
    obs = {"x": jax.random.normal(key, (T, B, 3))}
    action, extras = ppo.act(networks, CONFIG, state.params, obs, jax.random.key(2))
    good = (action[..., 0] > 0) if not networks.discrete else (action == 1)
    batch = {"observation": obs, "action": action, "reward": jnp.where(good, 1.0, -1.0),
             "discount": jnp.zeros((T, B)), "behaviour_log_prob": extras["log_prob"],
             "bootstrap_observation": {"x": jnp.zeros((B, 3))}}
    update = jax.jit(ppo.make_update(networks, CONFIG))
    before = float(jnp.mean(jnp.where(good, 1, -1) * networks.log_prob(state.params, obs, action)))
    for _ in range(5):
        state, metrics = update(state, batch)
    after = float(jnp.mean(jnp.where(good, 1, -1) * networks.log_prob(state.params, obs, action)))
    assert after > before
    assert float(metrics["ess_fraction"]) > 0.5 and int(state.iterations) == 5


def test_stale_batches_shrink_the_step_when_ess_collapses():
    config = ppo.PPOConfig(hidden_sizes=(16,), epochs=1, minibatches=2, staleness_correction=True)
    networks, state = ppo.init(jax.random.key(0), OBS, CONTINUOUS, config)
    T, B = 8, 4
    obs = {"x": jax.random.normal(jax.random.key(3), (T, B, 3))}
    action, extras = ppo.act(networks, config, state.params, obs, jax.random.key(4))
    base = {"observation": obs, "action": action, "reward": jnp.ones((T, B)), "discount": jnp.full((T, B), 0.9),
            "bootstrap_observation": {"x": jnp.zeros((B, 3))}}
    update = jax.jit(ppo.make_update(networks, config))
    _, fresh = update(state, dict(base, behaviour_log_prob=extras["log_prob"]))
    stale_logp = extras["log_prob"] + jax.random.normal(jax.random.key(5), (T, B)) * 3.0
    _, stale = update(state, dict(base, behaviour_log_prob=stale_logp))
    assert float(fresh["ess_fraction"]) == pytest.approx(1.0) and float(fresh["lr_scale"]) == 1.0
    assert float(stale["ess_fraction"]) < 0.5 and float(stale["lr_scale"]) < 1.0


def test_target_kl_stops_the_iteration_early_and_a_nonfinite_batch_changes_nothing():
    networks, state = ppo.init(jax.random.key(0), OBS, CONTINUOUS, CONFIG)
    T, B = 16, 4
    obs = {"x": jax.random.normal(jax.random.key(1), (T, B, 3))}
    action, extras = ppo.act(networks, CONFIG, state.params, obs, jax.random.key(2))
    batch = {"observation": obs, "action": action, "reward": jnp.where(action[..., 0] > 0, 10.0, -10.0),
             "discount": jnp.zeros((T, B)), "behaviour_log_prob": extras["log_prob"],
             "bootstrap_observation": {"x": jnp.zeros((B, 3))}}
    fast = ppo.PPOConfig(hidden_sizes=(16,), epochs=8, minibatches=4, learning_rate=0.05)
    _, free = jax.jit(ppo.make_update(networks, fast))(state, batch)
    import dataclasses
    _, capped = jax.jit(ppo.make_update(networks, dataclasses.replace(fast, target_kl=1e-4)))(state, batch)
    assert float(free["minibatch_steps"]) == 32 and 1 <= float(capped["minibatch_steps"]) < 32
    bad = dict(batch, reward=batch["reward"].at[0, 0].set(jnp.nan))
    new, metrics = jax.jit(ppo.make_update(networks, CONFIG))(state, bad)
    assert float(metrics["nonfinite_skipped"]) == 1.0
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(a, b)
