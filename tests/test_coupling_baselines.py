"""The offline baselines of the column experiment: fitted on recorded increments, run by the numpy runtime."""

import jax.numpy as jnp
import numpy as np

from embodyrl.coupling.baselines import (
    Increments,
    fit_mlp,
    fit_ridge,
    mlp_policy,
    mlp_predict,
    r2,
    ridge_policy,
    ridge_predict,
)
from embodyrl.coupling.learner import CouplingLearnerConfig
from embodyrl.hal import runtime
from embodyrl.hal.coupling.link import CouplingConfig, CouplingLink, level_inputs
from embodyrl.hal.steps import PolicyVersion

CFG = CouplingConfig(levels=10, features=3, context=2, radius=1, max_correction=3.0, explore=False)


def data(n: int, target, seed: int = 0) -> Increments:
    rng = np.random.default_rng(seed)
    profile = rng.normal(size=(n, CFG.levels, CFG.features)).astype(np.float32)
    context = rng.normal(size=(n, CFG.context)).astype(np.float32)
    window = level_inputs(profile, context, CFG.radius)
    return Increments(profile, context, target(window).astype(np.float32), np.zeros(n, np.int64))


def frozen_link(tmp_path, export) -> CouplingLink:
    path, _ = runtime.save(tmp_path / "policy", *export)
    return CouplingLink(CFG, 0, runtime.load(path))


def test_ridge_recovers_a_linear_increment_and_its_export_answers_the_same_through_a_link(tmp_path):
    w_true = np.linspace(-0.3, 0.3, CFG.window)
    train, test = data(400, lambda x: x @ w_true + 0.2), data(100, lambda x: x @ w_true + 0.2, seed=1)
    w, b = fit_ridge(train, CFG, l2=1e-8)
    np.testing.assert_allclose(w, w_true, atol=1e-3)
    assert abs(b - 0.2) < 1e-3 and r2(ridge_predict(test, CFG, w, b), test.increment) > 0.999
    link = frozen_link(tmp_path, ridge_policy(CFG, w, b, PolicyVersion(3, 1)))
    answer = link.exchange(test.profile, {"context": test.context})
    np.testing.assert_allclose(answer, ridge_predict(test, CFG, w, b), atol=1e-5)


def test_the_mlp_learns_what_ridge_cannot_and_its_export_matches_jax(tmp_path):
    def target(x):  # a threshold process of one feature: no linear fit explains it
        return 2.0 * np.maximum(x[..., 1], 0.0) - 0.8

    train, test = data(2000, target), data(200, target, seed=1)
    w, b = fit_ridge(train, CFG)
    ddpg = CouplingLearnerConfig().ddpg
    networks, params = fit_mlp(train, CFG, ddpg, seed=0, steps=1500)
    ridge_r2, mlp_r2 = r2(ridge_predict(test, CFG, w, b), test.increment), r2(mlp_predict(networks, params, test),
                                                                             test.increment)
    assert ridge_r2 < 0.8 < mlp_r2, (ridge_r2, mlp_r2)
    link = frozen_link(tmp_path, mlp_policy(networks, params, ddpg, PolicyVersion(3, 2)))
    answer = link.exchange(test.profile, {"context": test.context})
    np.testing.assert_allclose(answer, mlp_predict(networks, params, test), atol=1e-4)


def test_the_polynomial_recovers_a_quadratic_increment_and_its_export_answers_the_same_through_a_link(tmp_path):
    def target(x):  # products of two inputs and a square: beyond ridge, within degree 2
        return 0.5 * x[..., 0] * x[..., 3] - 0.3 * x[..., 2] ** 2 + 0.1 * x[..., 1] + 0.2

    train, test = data(600, target), data(100, target, seed=1)
    w, b = fit_ridge(train, CFG, l2=1e-9, degree=2)
    fitted = ridge_predict(test, CFG, w, b, degree=2)
    assert r2(fitted, test.increment) > 0.99 > r2(ridge_predict(test, CFG, *fit_ridge(train, CFG)), test.increment)
    link = frozen_link(tmp_path, ridge_policy(CFG, w, b, PolicyVersion(3, 1), degree=2))
    answer = link.exchange(test.profile, {"context": test.context})
    np.testing.assert_allclose(answer, fitted, atol=1e-4)


def test_the_gap_check_compares_the_mlp_with_the_better_of_ridge_and_the_polynomial():
    from embodyrl.coupling.baselines import gap_check

    fits = {"ridge": 0.4, "polynomial": 0.6}
    gap = gap_check(0.8, fits)
    assert gap["best_fit"] == "polynomial" and abs(gap["ratio"] - 0.8 / 0.6) < 1e-12 and gap["met"]
    assert not gap_check(0.75, fits)["met"] and gap_check(0.75, fits)["best_fit_r2"] == 0.6


def test_a_coupling_learner_warm_started_from_an_offline_fit_publishes_that_fit_and_refuses_another_network():
    import pytest

    from embodyrl.coupling.learner import CouplingLearner

    def target(x):
        return 2.0 * np.maximum(x[..., 1], 0.0) - 0.8

    train = data(500, target)
    ddpg = CouplingLearnerConfig().ddpg
    networks, params = fit_mlp(train, CFG, ddpg, seed=0, steps=200)
    _, arrays = mlp_policy(networks, params, ddpg, PolicyVersion(3, 2))
    learner = CouplingLearner(CFG, CouplingLearnerConfig())
    try:
        published = learner.published
        learner.warm_start(arrays)
        assert learner.published == published + 1
        _, exported = learner.export()
        for name in (n for n in arrays if n.startswith("actor/")):
            np.testing.assert_array_equal(exported[name], arrays[name])
        state = learner.state
        for a, b in zip(jax_leaves(state.actor_params), jax_leaves(state.target_actor_params), strict=True):
            np.testing.assert_array_equal(a, b)  # the target starts where the actor does
        obs = {"profile": train.profile[:50], "context": train.context[:50]}
        policy = learner.networks.policy(state.actor_params, obs)
        best = learner.networks.q_values(state.critic_params, obs, policy)
        for step in (-0.3, 0.3):  # the critic's best action is where the warm start acts
            other = jnp.clip(policy + step, -CFG.max_correction, CFG.max_correction)
            assert (learner.networks.q_values(state.critic_params, obs, other) < best).all()
        wrong = {**arrays, "actor/layers/0/kernel": arrays["actor/layers/0/kernel"][:-1]}
        with pytest.raises(ValueError, match="not this learner's actor network"):
            learner.warm_start(wrong)
    finally:
        learner.close()


def test_a_coupling_learner_started_at_zero_answers_nothing_and_its_critic_agrees(tmp_path):
    """A residual on another correction starts as nothing: its exported policy answers 0 for every
    row, and its critic's best action is there."""
    from embodyrl.coupling.learner import CouplingLearner

    train = data(50, lambda x: x[..., 1])
    learner = CouplingLearner(CFG, CouplingLearnerConfig())
    try:
        learner.start_at_zero()
        obs = {"profile": train.profile, "context": train.context}
        state = learner.state
        policy = learner.networks.policy(state.actor_params, obs)
        np.testing.assert_array_equal(np.asarray(policy), 0.0)
        link = frozen_link(tmp_path, learner.export())
        np.testing.assert_array_equal(link.exchange(train.profile, {"context": train.context}), 0.0)
        best = learner.networks.q_values(state.critic_params, obs, policy)
        for step in (-0.3, 0.3):
            assert (learner.networks.q_values(state.critic_params, obs, policy + step) < best).all()
    finally:
        learner.close()


def jax_leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]
