import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import sac
from embodyrl.algos.sac.losses import make_losses, td_target
from embodyrl.hal.specs import ArraySpec, DictSpec

OBS = DictSpec.of(ArraySpec("pos", (3,), np.float32))
ACT = ArraySpec("action", (2,), np.float32, [-2.0, 0.0], [2.0, 1.0])
CONFIG = sac.SACConfig(hidden_sizes=(32, 32))


def make_batch(key, n=64, discount=0.9):
    k = jax.random.split(key, 4)
    return {
        "observation": {"pos": jax.random.normal(k[0], (n, 3))},
        "action": jax.random.uniform(k[1], (n, 2), minval=ACT.minimum, maxval=ACT.maximum),
        "reward": jax.random.normal(k[2], (n,)),
        "discount": jnp.full((n,), discount),
        "next_observation": {"pos": jax.random.normal(k[3], (n, 3))},
    }


@pytest.fixture(scope="module")
def setup():
    return sac.init(jax.random.key(0), OBS, ACT, CONFIG)


def test_log_prob_is_the_squashed_gaussian_density(setup):
    networks, state = setup
    obs = make_batch(jax.random.key(1), n=256)["observation"]
    action, logp = networks.sample(state.actor_params, obs, jax.random.key(2))
    mean, log_std = networks.distribution(state.actor_params, obs)
    unit = networks.scale.to_unit(action)
    u = jnp.arctanh(jnp.clip(unit, -0.999999, 0.999999))
    std = jnp.exp(log_std)
    naive = jnp.sum(-0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)
                    - jnp.log(1 - jnp.tanh(u) ** 2), axis=-1)
    np.testing.assert_allclose(logp, naive, rtol=1e-3, atol=1e-3)
    assert (action >= ACT.minimum).all() and (action <= ACT.maximum).all()


def test_clipped_log_std_starts_near_one_and_holds_its_bounds():
    """``clip`` (SAC's own code, SBX): a fresh actor explores with std about 1, where ``tanh``
    rescaling starts at exp((min + max) / 2); both stay in [min, max] for any raw output."""
    from embodyrl.hal.runtime import bounded_log_std

    obs = make_batch(jax.random.key(1), n=256)["observation"]
    clipped = sac.SACConfig(hidden_sizes=(32, 32), log_std_bounds="clip", log_std_min=-20.0)
    networks, state = sac.init(jax.random.key(0), OBS, ACT, clipped)
    _, log_std = networks.distribution(state.actor_params, obs)
    assert abs(float(jnp.mean(log_std))) < 0.5
    assert (CONFIG.log_std_bounds, CONFIG.log_std_min, CONFIG.log_std_max) == ("tanh", -5.0, 2.0)  # the default
    tanh_networks, tanh_state = sac.init(jax.random.key(0), OBS, ACT, CONFIG)
    _, tanh_log_std = tanh_networks.distribution(tanh_state.actor_params, obs)
    assert abs(float(jnp.mean(tanh_log_std)) - (-5.0 + 2.0) / 2) < 0.5
    raw = jnp.linspace(-50.0, 50.0, 101)
    for bounds in ("clip", "tanh"):
        held = bounded_log_std(raw, -20.0, 2.0, bounds, jnp)
        assert float(held.min()) >= -20.0 and float(held.max()) <= 2.0
    np.testing.assert_array_equal(bounded_log_std(raw, -20.0, 2.0, "clip", jnp)[31:52], raw[31:52])  # inside (-20, 2) they pass
    with pytest.raises(ValueError, match="log_std_bounds"):
        sac.SACConfig(log_std_bounds="softplus")


def test_act_explores_or_returns_the_mean(setup):
    networks, state = setup
    obs = make_batch(jax.random.key(3), n=4)["observation"]
    a1, e1 = sac.act(networks, CONFIG, state.actor_params, obs, jax.random.key(4))
    a2, _ = sac.act(networks, CONFIG, state.actor_params, obs, jax.random.key(5))
    assert not np.allclose(a1, a2) and "log_prob" in e1
    m1, _ = sac.act(networks, CONFIG, state.actor_params, obs, jax.random.key(4), explore=False)
    m2, _ = sac.act(networks, CONFIG, state.actor_params, obs, jax.random.key(5), explore=False)
    np.testing.assert_array_equal(m1, m2)


def test_critic_loss_falls_on_a_fixed_batch(setup):
    networks, state = setup
    update = jax.jit(sac.make_update(networks, CONFIG))
    batch = make_batch(jax.random.key(6))
    losses = []
    for _ in range(400):  # the target is stochastic (a' ~ pi), so it falls more slowly than DDPG's
        state, m = update(state, batch)
        losses.append(float(m["critic_loss"]))
    assert np.mean(losses[-20:]) < 0.3 * np.mean(losses[:20])


def test_termination_stops_bootstrapping(setup):
    networks, state = setup
    batch = dict(make_batch(jax.random.key(7)), discount=jnp.zeros(64))
    y = td_target(networks, CONFIG, state.actor_params, state.target_critic_params, 0.5, batch, jax.random.key(0))
    np.testing.assert_allclose(y, batch["reward"], rtol=1e-6)
    truncated = dict(batch, discount=jnp.full(64, 0.9))
    y2 = td_target(networks, CONFIG, state.actor_params, state.target_critic_params, 0.5, truncated, jax.random.key(0))
    assert not np.allclose(y2, batch["reward"])


def test_temperature_moves_toward_the_target_entropy():
    networks, state = sac.init(jax.random.key(0), OBS, ACT, CONFIG)
    _, actor_loss, temperature_loss = make_losses(networks, CONFIG)
    low, high = jax.grad(temperature_loss)(0.0, -5.0, -2.0), jax.grad(temperature_loss)(0.0, 1.0, -2.0)
    assert low < 0 < high  # entropy below target: descending raises log_alpha; above: lowers it
    _, aux = actor_loss(state.actor_params, state.critic_params, 0.1, make_batch(jax.random.key(2)),
                        jax.random.key(3))
    assert float(aux["target_entropy"]) == -1.0 * 2  # SAC's -1 per action dimension


def test_rlpd_ensemble_uses_a_random_subset_and_layer_norm():
    config = sac.rlpd(CONFIG)
    networks, state = sac.init(jax.random.key(1), OBS, ACT, config)
    leaves = jax.tree_util.tree_flatten_with_path(state.critic_params)[0]
    assert all(leaf.shape[0] == 10 for _, leaf in leaves)
    assert any("norms" in jax.tree_util.keystr(path) for path, _ in leaves)
    batch = make_batch(jax.random.key(8))
    targets = [td_target(networks, config, state.actor_params, state.target_critic_params, 0.0, batch, jax.random.key(k))
               for k in range(6)]
    assert not all(np.allclose(targets[0], t) for t in targets[1:])  # different subsets, different minima
    state, metrics = jax.jit(sac.make_update(networks, config))(state, batch)
    assert np.isfinite(float(metrics["critic_loss"]))


def test_scan_equals_loop_and_traces_once(setup):
    networks, state = setup
    batches = [make_batch(jax.random.key(20 + i)) for i in range(3)]
    update = jax.jit(sac.make_update(networks, CONFIG))
    looped = state
    for b in batches:
        looped, _ = update(looped, b)
    traces = []
    update_many = sac.make_update_many(networks, CONFIG)

    def counted(s, b):
        traces.append(1)
        return update_many(s, b)

    step = jax.jit(counted)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
    scanned, _ = step(state, stacked)
    step(scanned, stacked)
    assert len(traces) == 1
    for a, b in zip(jax.tree.leaves(looped._replace(key=0)), jax.tree.leaves(scanned._replace(key=0)), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
