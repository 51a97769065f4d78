"""CrossQ: batch renormalisation as written (warm-up, the r and d corrections, running moments), the
joint critic step without targets, the delayed actor, and the numpy runtime's ``batch_norm``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import crossq, registry
from embodyrl.algos.crossq.networks import Norm, acting, mlp
from embodyrl.hal import runtime
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import PolicyVersion

OBS = DictSpec.of(ArraySpec("pos", (3,), np.float32))
ACT = ArraySpec("action", (2,), np.float32, [-2.0, 0.0], [2.0, 1.0])
CONFIG = crossq.CrossQConfig(hidden_sizes=(32, 32), critic_hidden_sizes=(64, 64), renorm_warmup_steps=4)
NORM = Norm(momentum=0.9, epsilon=1e-3, warmup=2, r_max=3.0, d_max=5.0)


def make_batch(key, n=64):
    k = jax.random.split(key, 4)
    return {"observation": {"pos": 3.0 + 2.0 * jax.random.normal(k[0], (n, 3))},
            "action": jax.random.uniform(k[1], (n, 2), minval=ACT.minimum, maxval=ACT.maximum),
            "reward": jax.random.normal(k[2], (n,)), "discount": jnp.full((n,), 0.9),
            "next_observation": {"pos": 3.0 + 2.0 * jax.random.normal(k[3], (n, 3))}}


def one_norm(width=3):
    params = {"layers": {0: {"kernel": jnp.eye(width), "bias": jnp.zeros(width)}},
              "norms": {0: {"scale": jnp.full(width, 2.0), "bias": jnp.full(width, 0.5)}}}
    stats = {"norms": {0: {"mean": jnp.zeros(width), "var": jnp.ones(width)}}, "count": jnp.zeros((), jnp.int32)}
    return params, stats


def test_during_the_warm_up_a_training_pass_normalises_by_the_batch_and_moves_the_running_moments():
    params, stats = one_norm()
    x = 10.0 + 4.0 * jax.random.normal(jax.random.key(0), (512, 3))
    y, new = mlp(params, stats, x, NORM, train=True)
    np.testing.assert_allclose(y.mean(0), 0.5, atol=1e-4)  # the norm's bias
    np.testing.assert_allclose(y.std(0), 2.0 * x.std(0) / np.sqrt(x.var(0) + 1e-3), rtol=1e-4)  # its scale
    np.testing.assert_allclose(new["norms"][0]["mean"], 0.1 * x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(new["norms"][0]["var"], 0.9 + 0.1 * x.var(0), rtol=1e-5)
    assert int(new["count"]) == 1
    acted, same = mlp(params, stats, x, NORM, train=False)  # acting reads the running moments, moves nothing
    np.testing.assert_allclose(acted, x / np.sqrt(1 + 1e-3) * 2.0 + 0.5, rtol=1e-5)
    assert same["norms"][0] is stats["norms"][0] and int(same["count"]) == 0


def test_after_the_warm_up_renormalisation_pulls_towards_the_running_moments_within_r_max_and_d_max():
    params, stats = one_norm()
    x = 10.0 + 4.0 * jax.random.normal(jax.random.key(0), (512, 3))
    mean, var = x.mean(0), x.var(0)
    warm = {**stats, "count": jnp.asarray(NORM.warmup, jnp.int32)}
    # running moments equal to the batch's: r = 1 and d = 0, plain batch normalisation
    equal = {**warm, "norms": {0: {"mean": mean, "var": var}}}
    np.testing.assert_allclose(mlp(params, equal, x, NORM, True)[0], mlp(params, stats, x, NORM, True)[0], rtol=1e-5)
    # far running moments: the output is the running normalisation, with r and d clipped at their limits
    y, _ = mlp(params, warm, x, NORM, train=True)
    std = np.sqrt(var + 1e-3)
    r = np.clip(std / np.sqrt(1 + 1e-3), 1 / 3, 3.0)
    d = np.clip(mean / np.sqrt(1 + 1e-3), -5.0, 5.0)
    np.testing.assert_allclose(y, ((x - mean) / std * r + d) * 2.0 + 0.5, rtol=1e-4, atol=1e-4)
    assert (r == 3.0).all() and (d == 5.0).all()  # both at their limits here


@pytest.fixture(scope="module")
def trained():
    """A state after 6 updates on one batch (scanned), with the networks and the update."""
    networks, state = crossq.init(jax.random.key(0), OBS, ACT, CONFIG)
    update = jax.jit(crossq.make_update(networks, CONFIG))
    batch = make_batch(jax.random.key(1))
    states = [state]
    for _ in range(6):
        states.append(update(states[-1], batch)[0])
    return networks, states, update, batch


def test_the_critics_step_every_update_and_the_actor_and_temperature_every_third(trained):
    _, states, _, _ = trained
    changed = [not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(s.actor_params),
                                                             jax.tree.leaves(t.actor_params), strict=True))
               for s, t in zip(states, states[1:], strict=False)]
    assert changed == [False, False, True, False, False, True]
    assert [float(s.log_alpha) != float(t.log_alpha) for s, t in zip(states, states[1:], strict=False)] == changed
    assert [int(s.critic_stats["count"][0]) for s in states] == [0, 1, 2, 3, 4, 5, 6]  # a pass per critic step
    assert [int(s.actor_stats["count"]) for s in states] == [0, 0, 0, 1, 1, 1, 2]
    assert not hasattr(states[0], "target_critic_params")  # no target networks


def test_the_critic_normalises_both_halves_with_the_joint_batchs_moments(trained):
    networks, states, _, batch = trained
    state = states[0]
    joint = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), batch["observation"], batch["next_observation"])
    action = jnp.concatenate([batch["action"], batch["action"]])
    _, stats = networks.q_values(state.critic_params, state.critic_stats, joint, action, train=True)
    xa = jnp.concatenate([joint["pos"], networks.scale.to_unit(action)], -1)
    np.testing.assert_allclose(stats["norms"][0]["mean"][0], 0.01 * xa.mean(0), rtol=1e-4)  # momentum 0.99


def test_the_critic_loss_falls_on_a_fixed_batch(trained):
    networks, states, update, batch = trained
    state, losses = states[0], []
    for _ in range(60):
        state, metrics = update(state, batch)
        losses.append(float(metrics["critic_loss"]))
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])


def test_the_numpy_runtime_acts_as_the_trained_actor_does_through_its_running_moments(trained):
    networks, states, _, _ = trained
    algorithm = registry.build("crossq", CONFIG)
    actor = algorithm.actor_params(states[-1])
    assert float(jnp.abs(actor["norms"][0]["mean"]).max()) > 0.01  # the moments have moved off 0 and 1
    meta, arrays = algorithm.export(networks, actor, PolicyVersion(1, 6))
    assert [op["op"] for op in meta["graph"]][:4] == ["concat", "batch_norm", "dense", "relu"]
    policy = runtime.NumpyPolicy(meta, arrays, seed=0)
    obs = {"pos": np.asarray(make_batch(jax.random.key(5), 16)["observation"]["pos"])}
    np.testing.assert_allclose(policy.mean_action(obs), algorithm.mean_action(networks, actor, obs), rtol=1e-5,
                               atol=1e-5)
    # follows the learner's weights by their published names, moments included
    newer = {k: v for k, v in arrays.items() if k.startswith("actor/")}
    newer["actor/norms/0/mean"] = newer["actor/norms/0/mean"] + 1.0
    policy.load_weights(PolicyVersion(1, 7), newer)
    moved = acting(crossq.networks.trainable(actor), {
        "norms": {i: {"mean": actor["norms"][i]["mean"] + (i == 0), "var": actor["norms"][i]["var"]}
                  for i in actor["norms"]}, "count": 0})
    np.testing.assert_allclose(policy.mean_action(obs), algorithm.mean_action(networks, moved, obs), rtol=1e-5,
                               atol=1e-5)


def test_the_runtime_refuses_a_batch_norm_of_the_wrong_width_or_a_negative_variance(trained):
    networks, states, _, _ = trained
    algorithm = registry.build("crossq", CONFIG)
    meta, arrays = algorithm.export(networks, algorithm.actor_params(states[-1]))
    wrong = {**arrays, "actor/norms/1/mean": np.zeros(5, np.float32)}
    with pytest.raises(runtime.ExportError, match="actor/norms/1/mean: shape"):
        runtime.NumpyPolicy(meta, wrong)
    negative = {**arrays, "actor/norms/0/var": -np.ones(3, np.float32)}
    with pytest.raises(runtime.ExportError, match="actor/norms/0/var: a variance below 0"):
        runtime.NumpyPolicy(meta, negative)


def test_bad_settings_and_camera_observations_are_refused_by_name():
    with pytest.raises(ValueError, match="policy_delay"):
        crossq.CrossQConfig(policy_delay=0)
    with pytest.raises(ValueError, match="batch_norm_momentum"):
        crossq.CrossQConfig(batch_norm_momentum=1.0)
    pixels = DictSpec.of(ArraySpec("top", (8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"crossq reads state observations; \['top'\] are camera images"):
        crossq.init(jax.random.key(0), pixels, ACT, CONFIG)


def test_a_reward_only_camera_is_sent_but_never_read_by_the_networks_or_the_runtime():
    """A robot file's ``reward_only`` camera arrives as ``crossq.encoder.ignore_fields``: the learnt
    reward reads it at the edge; the networks and the exported graph read only the state."""
    from dataclasses import replace

    from embodyrl.algos.encoder_config import EncoderConfig

    spec = DictSpec.of(ArraySpec("pos", (3,), np.float32), ArraySpec("top", (8, 8, 3), np.uint8))
    config = replace(CONFIG, encoder=EncoderConfig(ignore_fields=("top",)))
    algorithm = registry.build("crossq", config)
    networks, state = algorithm.init(jax.random.key(0), spec, ACT)
    assert list(networks.inputs) == ["pos"]
    meta, arrays = algorithm.export(networks, algorithm.actor_params(state))
    assert meta["graph"][0] == {"op": "concat", "fields": ["pos"]}
    obs = {"pos": np.ones((4, 3), np.float32), "top": np.zeros((4, 8, 8, 3), np.uint8)}
    np.testing.assert_allclose(runtime.NumpyPolicy(meta, arrays).mean_action(obs),
                               algorithm.mean_action(networks, algorithm.actor_params(state), obs), atol=1e-5)
    reading = registry.build("crossq", replace(CONFIG, encoder=EncoderConfig(image_fields=("top",))))
    with pytest.raises(ValueError, match=r"\['top'\] are camera images"):  # an encoder it does not have
        reading.init(jax.random.key(0), spec, ACT)
