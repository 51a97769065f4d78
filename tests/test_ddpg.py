from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import ddpg
from embodyrl.algos.ddpg.losses import td_target
from embodyrl.hal.specs import ArraySpec, DictSpec

OBS = DictSpec.of(ArraySpec("pos", (2,), np.float32), ArraySpec("vel", (1,), np.float32))
ACT = ArraySpec("action", (2,), np.float32, [-2.0, 0.0], [2.0, 1.0])
CONFIG = ddpg.DDPGConfig(hidden_sizes=(32, 32), batch_size=64)


def make_batch(key, n=64, discount=0.9):
    k = jax.random.split(key, 5)
    return {
        "observation": {"pos": jax.random.normal(k[0], (n, 2)), "vel": jax.random.normal(k[1], (n, 1))},
        "action": jax.random.uniform(k[2], (n, 2), minval=ACT.minimum, maxval=ACT.maximum),
        "reward": jax.random.normal(k[3], (n,)),
        "discount": jnp.full((n,), discount),
        "next_observation": {"pos": jax.random.normal(k[4], (n, 2)), "vel": jnp.zeros((n, 1))},
    }


@pytest.fixture(scope="module")
def setup():
    return ddpg.init(jax.random.key(0), OBS, ACT, CONFIG)


def test_update_lowers_critic_loss_on_a_fixed_batch(setup):
    networks, state = setup
    update = jax.jit(ddpg.make_update(networks, CONFIG))
    batch = make_batch(jax.random.key(1))
    losses = []
    for _ in range(200):
        state, metrics = update(state, batch)
        losses.append(float(metrics["critic_loss"]))
    assert np.mean(losses[-20:]) < 0.3 * np.mean(losses[:20])
    assert int(state.steps) == 200


def test_terminal_targets_do_not_bootstrap_and_truncated_ones_do(setup):
    networks, state = setup
    batch = make_batch(jax.random.key(2))
    q_next = networks.q_values(state.target_critic_params, batch["next_observation"],
                               networks.policy(state.target_actor_params, batch["next_observation"]))[0]
    key = jax.random.key(0)
    terminal = dict(batch, discount=jnp.zeros(64))
    np.testing.assert_allclose(td_target(networks, CONFIG, state.target_actor_params, state.target_critic_params,
                                         terminal, key), batch["reward"], rtol=1e-6)
    truncated = dict(batch, discount=jnp.full(64, 0.9))
    np.testing.assert_allclose(td_target(networks, CONFIG, state.target_actor_params, state.target_critic_params,
                                         truncated, key), batch["reward"] + 0.9 * q_next, rtol=1e-5)


def test_actions_respect_bounds_even_with_large_noise(setup):
    networks, state = setup
    noisy = ddpg.DDPGConfig(hidden_sizes=(32, 32), exploration_noise=10.0)
    obs = make_batch(jax.random.key(3), n=1000)["observation"]
    action, _ = ddpg.act(networks, noisy, state.actor_params, obs, jax.random.key(4))
    assert (action >= ACT.minimum).all() and (action <= ACT.maximum).all()
    assert (action == ACT.maximum).any()  # the noise really pushed some to the bound
    greedy = networks.policy(state.actor_params, obs)
    assert (greedy >= ACT.minimum).all() and (greedy <= ACT.maximum).all()


def test_scan_of_updates_equals_a_loop_of_updates(setup):
    networks, state = setup
    batches = [make_batch(jax.random.key(10 + i)) for i in range(4)]
    update = jax.jit(ddpg.make_update(networks, CONFIG))
    looped = state
    for b in batches:
        looped, _ = update(looped, b)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
    scanned, _ = jax.jit(ddpg.make_update_many(networks, CONFIG))(state, stacked)
    for a, b in zip(jax.tree.leaves(looped._replace(key=0)), jax.tree.leaves(scanned._replace(key=0)),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_update_is_traced_once(setup):
    networks, state = setup
    traces = []
    update_many = ddpg.make_update_many(networks, CONFIG)

    def counted(s, b):
        traces.append(1)
        return update_many(s, b)

    step = jax.jit(counted, donate_argnums=0)
    state = jax.tree.map(jnp.copy, state)
    for i in range(3):
        batches = jax.tree.map(lambda *xs: np.stack(xs), *[jax.device_get(make_batch(jax.random.key(i)))] * 2)
        state, _ = step(state, batches)
    assert len(traces) == 1


def test_target_networks_move_by_tau(setup):
    networks, state = setup
    new_state, _ = jax.jit(ddpg.make_update(networks, CONFIG))(state, make_batch(jax.random.key(5)))
    for old_t, new_t, new_p in zip(jax.tree.leaves(state.target_critic_params),
                                   jax.tree.leaves(new_state.target_critic_params),
                                   jax.tree.leaves(new_state.critic_params), strict=True):
        np.testing.assert_allclose(new_t, (1 - CONFIG.tau) * old_t + CONFIG.tau * new_p, rtol=1e-5, atol=1e-7)


TD3 = ddpg.td3(CONFIG)


def test_td3_target_takes_the_smaller_critic():
    networks, state = ddpg.init(jax.random.key(1), OBS, ACT, TD3)
    assert jax.tree.leaves(state.critic_params)[0].shape[0] == 2
    batch = make_batch(jax.random.key(6))
    exact = ddpg.DDPGConfig(hidden_sizes=(32, 32), num_critics=2)  # no smoothing noise
    next_obs = batch["next_observation"]
    qs = networks.q_values(state.target_critic_params, next_obs, networks.policy(state.target_actor_params, next_obs))
    assert not np.allclose(qs[0], qs[1])
    y = td_target(networks, exact, state.target_actor_params, state.target_critic_params, batch, jax.random.key(0))
    np.testing.assert_allclose(y, batch["reward"] + 0.9 * np.minimum(qs[0], qs[1]), rtol=1e-5)


def test_target_smoothing_noise_is_clipped_and_stays_in_bounds():
    from embodyrl.algos.ddpg.losses import target_action

    networks, state = ddpg.init(jax.random.key(2), OBS, ACT, TD3)
    obs = make_batch(jax.random.key(7), n=2000)["observation"]
    clean = networks.policy(state.target_actor_params, obs)
    noisy = target_action(networks, TD3, state.target_actor_params, obs, jax.random.key(8))
    half = networks.scale.half_range
    assert not np.allclose(clean, noisy)
    assert np.all(np.abs(noisy - clean) <= TD3.target_noise_clip * half + 1e-6)
    assert (noisy >= ACT.minimum).all() and (noisy <= ACT.maximum).all()


def same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_delayed_policy_updates_move_actor_and_targets_every_other_step():
    """Fujimoto's TD3: the targets wait with the actor."""
    fujimoto = replace(TD3, delay_targets=True)
    networks, state = ddpg.init(jax.random.key(3), OBS, ACT, fujimoto)
    update = jax.jit(ddpg.make_update(networks, fujimoto))
    batch = make_batch(jax.random.key(9))

    s1, _ = update(state, batch)  # step 0: everything moves
    assert not same(s1.actor_params, state.actor_params) and not same(s1.target_critic_params, state.target_critic_params)
    s2, _ = update(s1, batch)  # step 1: critics only
    assert same(s2.actor_params, s1.actor_params) and same(s2.target_actor_params, s1.target_actor_params)
    assert same(s2.target_critic_params, s1.target_critic_params)
    assert not same(s2.critic_params, s1.critic_params)
    s3, _ = update(s2, batch)  # step 2: the actor moves again
    assert not same(s3.actor_params, s2.actor_params)


def test_the_actor_waits_for_the_critic_for_actor_starts_after_steps():
    config = replace(CONFIG, actor_starts_after=3)
    networks, state = ddpg.init(jax.random.key(3), OBS, ACT, config)
    update = jax.jit(ddpg.make_update(networks, config))
    batch = make_batch(jax.random.key(9))
    start = state
    for _ in range(3):
        state, metrics = update(state, batch)
        assert np.isfinite(metrics["actor_loss"])
    assert same(state.actor_params, start.actor_params) and not same(state.critic_params, start.critic_params)
    moved, _ = update(state, batch)  # step 3: the actor's first
    assert not same(moved.actor_params, start.actor_params)
    with pytest.raises(ValueError, match="actor_starts_after"):
        replace(CONFIG, actor_starts_after=-1)


def test_undelayed_targets_move_every_step_and_the_actor_can_ascend_the_smaller_critic():
    """SBX's TD3 (the default): the targets move after every critic step while the actor still
    waits, and the actor ascends min(Q1, Q2) instead of Q1."""
    from embodyrl.algos.ddpg.losses import make_losses

    config = TD3
    assert (config.delay_targets, config.actor_q) == (False, "min")
    networks, state = ddpg.init(jax.random.key(3), OBS, ACT, config)
    update = jax.jit(ddpg.make_update(networks, config))
    batch = make_batch(jax.random.key(9))
    s1, _ = update(state, batch)
    s2, _ = update(s1, batch)  # step 1: the actor waits, the targets do not
    assert same(s2.actor_params, s1.actor_params)
    assert not same(s2.target_critic_params, s1.target_critic_params)
    assert not same(s2.target_actor_params, s1.target_actor_params)
    obs = batch["observation"]
    qs = networks.q_values(state.critic_params, obs, networks.policy(state.actor_params, obs))
    assert not np.allclose(qs[0], qs[1])
    for actor_q, expected in (("min", np.min(qs, axis=0)), ("first", qs[0])):
        actor_loss = make_losses(networks, replace(config, actor_q=actor_q))[1]
        np.testing.assert_allclose(actor_loss(state.actor_params, state.critic_params, batch), -np.mean(expected),
                                   rtol=1e-5)
    with pytest.raises(ValueError, match="actor_q"):
        replace(config, actor_q="mean")


def test_behaviour_cloning_adds_the_distance_to_the_batch_actions_and_pulls_the_actor_to_them(setup):
    """TD3+BC (Fujimoto & Gu 2021): -Q / mean|Q| plus bc_weight times the mean squared distance, in
    half ranges, to the batch's actions; a strong weight makes the actor imitate them."""
    from embodyrl.algos.ddpg.losses import make_losses

    networks, state = setup
    batch = make_batch(jax.random.key(4))
    obs = batch["observation"]
    config = replace(CONFIG, bc_weight=0.4)
    action = networks.policy(state.actor_params, obs)
    q = networks.q_values(state.critic_params, obs, action)[0]
    distance = ((action - batch["action"]) / networks.scale.half_range) ** 2
    expected = -np.mean(q) / np.mean(np.abs(q)) + 0.4 * np.mean(distance)
    actor_loss = make_losses(networks, config)[1]
    np.testing.assert_allclose(actor_loss(state.actor_params, state.critic_params, batch), expected, rtol=1e-5)

    imitate = replace(CONFIG, bc_weight=100.0)
    update = jax.jit(ddpg.make_update(networks, imitate))
    target = dict(batch, action=jnp.broadcast_to(jnp.asarray([1.0, 0.25]), batch["action"].shape))
    before = float(jnp.mean(jnp.abs(action - target["action"])))
    for _ in range(300):
        state, _ = update(state, target)
    after = float(jnp.mean(jnp.abs(networks.policy(state.actor_params, obs) - target["action"])))
    assert after < 0.2 * before
    with pytest.raises(ValueError, match="bc_weight"):
        replace(CONFIG, bc_weight=-1.0)
