"""Prioritised replay end to end: the pure updates take per-sample importance weights (ones when
absent) and return per-sample TD errors; through a real learner the TD errors become priorities,
rows with large ones are drawn more, and their importance weights are smaller."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import ddpg, dqn, sac
from embodyrl.config import LearnerConfig, TrainConfig
from embodyrl.hal.layout import Layout
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import PolicyVersion, StepRecorder
from embodyrl.learner import build_learner

OBS = DictSpec.of(ArraySpec("x", (2,), np.float32))
ACT = ArraySpec("action", (1,), np.float32, -1, 1)
B = 8


def _batch(seed: int, discrete: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    action = rng.integers(0, 3, B) if discrete else rng.uniform(-1, 1, (B, 1))
    return {"observation": {"x": rng.normal(size=(B, 2)).astype(np.float32)},
            "action": action.astype(np.int32 if discrete else np.float32),
            "reward": rng.normal(size=B).astype(np.float32), "discount": np.full(B, 0.9, np.float32),
            "next_observation": {"x": rng.normal(size=(B, 2)).astype(np.float32)}}


def _weighted(batch, weight):
    return {**batch, "weight": jnp.asarray(weight, jnp.float32)}


@pytest.mark.parametrize("family", ["ddpg", "sac"])
def test_the_critic_loss_is_the_importance_weighted_mean_of_per_sample_losses(family):
    batch, key = _batch(0), jax.random.key(3)
    if family == "ddpg":
        config = ddpg.td3(ddpg.DDPGConfig(hidden_sizes=(8,)))
        networks, state = ddpg.init(jax.random.key(0), OBS, ACT, config)
        critic_loss, _ = ddpg.losses.make_losses(networks, config)
        loss = jax.jit(lambda b: critic_loss(state.critic_params, state.target_actor_params,
                                             state.target_critic_params, b, key))
    else:
        config = sac.rlpd(sac.SACConfig(hidden_sizes=(8,), num_critics=3))
        networks, state = sac.init(jax.random.key(0), OBS, ACT, config)
        critic_loss, _, _ = sac.losses.make_losses(networks, config)
        loss = jax.jit(lambda b: critic_loss(state.critic_params, state.actor_params,
                                             state.target_critic_params, 1.0, b, key))
    plain, aux = loss(batch)
    assert "td_error" not in aux  # uniform replay: every metric stays a scalar
    ones, aux = loss(_weighted(batch, np.ones(B)))
    assert float(ones) == float(plain)  # ones: the unweighted loss
    assert aux["td_error"].shape == (B,) and (aux["td_error"] >= 0).all()
    each = np.array([float(loss(_weighted(batch, np.eye(B)[i]))[0]) for i in range(B)])  # sample i alone
    np.testing.assert_allclose(each.sum(), float(plain), rtol=1e-5)
    w = np.random.default_rng(1).uniform(0, 1, B)
    np.testing.assert_allclose(float(loss(_weighted(batch, w))[0]), w @ each, rtol=1e-5)  # linear in the weights
    assert abs(float(loss(_weighted(batch, w))[0]) - float(plain)) > 1e-3 * abs(float(plain))


@pytest.mark.parametrize("family", ["ddpg", "sac", "dqn"])
def test_weights_reach_the_update_and_td_errors_come_back_per_sample(family):
    discrete = family == "dqn"
    if family == "ddpg":
        module, config = ddpg, ddpg.DDPGConfig(hidden_sizes=(8,))
    elif family == "sac":
        module, config = sac, sac.SACConfig(hidden_sizes=(8,))
    else:
        module = dqn
        config = dqn.DQNConfig(hidden_sizes=(8,))
    action = ArraySpec("action", (), np.int32, 0, 2) if discrete else ACT
    networks, state = module.init(jax.random.key(0), OBS, action, config)
    update = jax.jit(module.make_update_many(networks, config))
    batches = jax.tree.map(lambda *xs: np.stack(xs), _batch(0, discrete), _batch(1, discrete))  # K = 2
    copy = lambda: jax.tree.map(jnp.copy, state)  # noqa: E731
    plain, metrics = update(copy(), batches)
    assert "td_error" not in metrics
    ones, metrics = update(copy(), {**batches, "weight": np.ones((2, B), np.float32)})
    assert metrics["td_error"].shape == (2, B)  # per sample, not averaged over the scan
    skewed, _ = update(copy(), {**batches, "weight": np.tile(np.linspace(0, 1, B, dtype=np.float32), (2, 1))})
    params = (lambda s: s.params) if discrete else (lambda s: s.critic_params)
    for a, b in zip(jax.tree.leaves(params(plain)), jax.tree.leaves(params(ones)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(params(plain)),
                                                     jax.tree.leaves(params(skewed)), strict=True))


def _learner(tmp_path, priority: bool):
    lc = LearnerConfig(min_replay=64, replay_capacity=2048, replay_chunk_rows=256, updates_per_step=100.0,
                       updates_per_call=4, publish_every=10**6, prefetch_batches=0, checkpoint_every_s=3600,
                       log_every_s=3600, priority=priority, priority_alpha=1.0)
    config = TrainConfig(steps=1000, learner=lc)
    config = dataclasses.replace(config, ddpg=dataclasses.replace(config.ddpg, hidden_sizes=(8,), batch_size=32))
    learner = build_learner(config, Layout.of("toy", OBS, ACT), tmp_path)
    recorder = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    for episode in range(4):  # 4 x 50 transitions; only episode 0's rewards are large
        for t in range(50):
            recorder.add({"x": np.array([episode, t / 50], np.float32)}, np.zeros(1, np.float32),
                         np.zeros(1, np.float32), 100.0 if episode == 0 else 0.0, False, t == 49,
                         PolicyVersion(1, 0))
        recorder.add_final({"x": np.array([episode, 1.0], np.float32)})
        learner.data.add(recorder.flush(), episode + 1, 0)
    learner.data.commit(final=True)
    return learner


def _drawn_from_episode_0(learner, calls: int) -> float:
    rows = learner.data.replay.store.rows
    share = []
    for _ in range(calls):
        assert learner.train()
        share.append(np.mean(rows["observation/x"][learner.data.last_batch_keys["slot"], 0] == 0))
    return float(np.mean(share))


def test_large_td_errors_are_drawn_more_and_weighted_less_through_the_learner(tmp_path):
    prioritised, uniform = _learner(tmp_path / "p", True), _learner(tmp_path / "u", False)
    try:
        _drawn_from_episode_0(prioritised, 10)  # every row drawn, its TD error written back
        share = _drawn_from_episode_0(prioritised, 5)
        control = _drawn_from_episode_0(uniform, 5)
        print(f"drawn from the large-TD episode: {share:.2f} prioritised, {control:.2f} uniform")
        assert control < 0.35 and share > 0.6, (share, control)  # a quarter of the rows when uniform

        batch, _ = prioritised.data.batch()  # what the update receives: importance weights
        keys = prioritised.data.last_batch_keys
        assert batch["weight"].shape == (4, 32) and "weight" not in uniform.data.batch()[0]
        np.testing.assert_allclose(batch["weight"].max(axis=1), 1.0)
        large = prioritised.data.replay.store.rows["observation/x"][keys["slot"], 0] == 0
        assert batch["weight"][large].mean() < 0.5 * batch["weight"][~large].mean()
        # beta anneals from learner.priority_beta to 1 over the planned updates (1000 steps x 100)
        data = prioritised.data
        assert data.metrics()["priority_beta"] == pytest.approx(0.4, abs=1e-3)
        data.limiter.samples = 50_000
        assert data.beta == pytest.approx(0.7)
        data.limiter.samples = 200_000
        assert data.beta == 1.0
    finally:
        for learner in (prioritised, uniform):
            learner.server.close()
            learner.data.close(failed=False)
