"""Pixels: the conv encoder, DrQ's random shift, gradient routing, uint8 replay, no retrace."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import ddpg, sac
from embodyrl.algos.encoders import EncoderConfig, make_encoder, random_shift
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import Steps
from embodyrl.replay import PersistentReplay

IMAGE = "camera/front"
OBS = DictSpec.of(ArraySpec(IMAGE, (16, 16, 6), np.uint8, 0, 255), ArraySpec("orientation", (2,), np.float32))
ACT = ArraySpec("action", (1,), np.float32, -2.0, 2.0)
SMALL = EncoderConfig(image_fields=("auto",), channels=(4, 4), strides=(2, 1), feature_dim=8, augment_pad=2)
B = 8


def _batch(seed=0, batch=B):
    rng = np.random.default_rng(seed)

    def obs():
        return {IMAGE: rng.integers(0, 256, (batch, 16, 16, 6), dtype=np.uint8),
                "orientation": rng.normal(size=(batch, 2)).astype(np.float32)}

    return {"observation": obs(), "next_observation": obs(),
            "action": rng.uniform(-2, 2, (batch, 1)).astype(np.float32),
            "reward": rng.normal(size=batch).astype(np.float32), "discount": np.full(batch, 0.99, np.float32)}


def test_encoder_shapes_state_fields_and_pixels_only():
    encoder, params = make_encoder(OBS, SMALL, jax.random.key(0))
    assert encoder.image_fields == (IMAGE,) and encoder.state_fields == ("orientation",)
    x = encoder(params, _batch()["observation"])
    assert x.shape == (B, 8 + 2) and x.dtype == jnp.float32
    np.testing.assert_array_equal(x[:, 8:], _batch()["observation"]["orientation"])
    assert np.all(np.abs(x[:, :8]) <= 1.0)  # tanh features
    only, _ = make_encoder(OBS, EncoderConfig(image_fields=(IMAGE,), channels=(4,), strides=(2,), pixels_only=True),
                           jax.random.key(0))
    assert only.state_fields == () and only.size == 50
    assert make_encoder(DictSpec.of(ArraySpec("x", (3,), np.float32)), SMALL, jax.random.key(0)) == (None, None)
    assert make_encoder(OBS, EncoderConfig(), jax.random.key(0)) == (None, None)  # opt-in: images flattened


def test_encoder_config_errors_name_the_field():
    with pytest.raises(ValueError, match="image_fields: 'camera/side'"):
        make_encoder(OBS, EncoderConfig(image_fields=("camera/side",)), jax.random.key(0))
    with pytest.raises(ValueError, match="not HxWxC"):
        make_encoder(OBS, EncoderConfig(image_fields=("orientation",)), jax.random.key(0))
    with pytest.raises(ValueError, match="same length"):
        EncoderConfig(channels=(4, 4), strides=(2,))
    with pytest.raises(ValueError, match="too small"):
        make_encoder(OBS, EncoderConfig(image_fields=(IMAGE,), channels=(4,) * 6, strides=(2,) * 6), jax.random.key(0))


def test_random_shift_moves_by_at_most_the_pad_and_keeps_content():
    pad = 4
    images = jnp.asarray(np.random.default_rng(1).integers(0, 256, (32, 20, 20, 3), dtype=np.uint8))
    offsets = jax.random.randint(jax.random.key(3), (32, 2), 0, 2 * pad + 1)
    shifted = np.asarray(random_shift(images, offsets, pad))
    assert shifted.dtype == np.uint8 and shifted.shape == images.shape
    original = np.asarray(images)
    for image, out, (row, col) in zip(original, shifted, np.asarray(offsets), strict=True):
        dy, dx = int(row) - pad, int(col) - pad
        assert abs(dy) <= pad and abs(dx) <= pad
        # the interior shows the original moved by (dy, dx); the border repeats edge pixels
        inner = out[pad:-pad, pad:-pad]
        np.testing.assert_array_equal(inner, image[pad + dy:20 - pad + dy, pad + dx:20 - pad + dx])
    centred = random_shift(images, jnp.full((32, 2), pad), pad)
    np.testing.assert_array_equal(np.asarray(centred), original)
    assert len({tuple(o) for o in np.asarray(offsets)}) > 5  # independent offsets per image


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_encoder_is_trained_by_the_critic_only(algo):
    from embodyrl.algos.ddpg.losses import make_losses as ddpg_losses
    from embodyrl.algos.sac.losses import make_losses as sac_losses

    batch = jax.tree.map(jnp.asarray, _batch())
    if algo == "td3":
        config = ddpg.td3(ddpg.DDPGConfig(hidden_sizes=(16,), batch_size=B, encoder=SMALL))
        networks, state = ddpg.init(jax.random.key(0), OBS, ACT, config)
        critic_loss, actor_loss = ddpg_losses(networks, config)
        c_grads = jax.grad(lambda c: critic_loss(c, state.target_actor_params, state.target_critic_params,
                                                 batch, jax.random.key(1))[0])(state.critic_params)
        a_grads = jax.grad(actor_loss)(state.actor_params, state.critic_params, batch)
        update = ddpg.make_update(networks, config)
    else:
        config = sac.SACConfig(hidden_sizes=(16,), batch_size=B, encoder=SMALL)
        networks, state = sac.init(jax.random.key(0), OBS, ACT, config)
        critic_loss, actor_loss, _ = sac_losses(networks, config)
        c_grads = jax.grad(lambda c: critic_loss(c, state.actor_params, state.target_critic_params, 1.0,
                                                 batch, jax.random.key(1))[0])(state.critic_params)
        a_grads = jax.grad(lambda a: actor_loss(a, state.critic_params, 1.0, batch, jax.random.key(2))[0])(
            state.actor_params)
        update = sac.make_update(networks, config)
    norm = lambda tree: float(sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(tree)))  # noqa: E731
    assert norm(c_grads["encoder"]) > 0  # the critic's loss reaches the encoder
    assert norm(a_grads["encoder"]) == 0.0  # the actor's does not
    assert norm(a_grads["policy"]) > 0
    new, _ = jax.jit(update)(state, batch)
    # the encoder moved, and the actor now reads exactly the critic's
    assert norm(jax.tree.map(jnp.subtract, new.critic_params["encoder"], state.critic_params["encoder"])) > 0
    for a, c in zip(jax.tree.leaves(new.actor_params["encoder"]), jax.tree.leaves(new.critic_params["encoder"]),
                    strict=True):
        np.testing.assert_array_equal(a, c)


def test_the_jitted_update_does_not_retrace_and_takes_uint8():
    traces = []
    config = sac.SACConfig(hidden_sizes=(16,), batch_size=B, encoder=SMALL)
    networks, state = sac.init(jax.random.key(0), OBS, ACT, config)
    update_many = sac.make_update_many(networks, config)

    def counted(state, batches):
        traces.append(batches["observation"][IMAGE].dtype)
        return update_many(state, batches)

    step = jax.jit(counted, donate_argnums=0)
    for seed in range(3):
        batches = jax.tree.map(lambda *xs: np.stack(xs), _batch(seed), _batch(seed + 10))
        state, metrics = step(state, batches)
    assert traces == [jnp.uint8]  # one trace, with the images still uint8
    assert all(np.isfinite(float(v)) for v in metrics.values())


def test_replay_stores_and_samples_images_as_uint8(tmp_path):
    n = 24
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 16, 16, 6), dtype=np.uint8)
    final = (np.arange(n) % 12) == 11
    steps = Steps(observation={IMAGE: images, "orientation": np.zeros((n, 2), np.float32)},
                  action=np.zeros((n, 1), np.float32), proposed_action=np.zeros((n, 1), np.float32),
                  log_prob=np.zeros(n, np.float32), reward=np.arange(n, dtype=np.float32),
                  terminated=np.zeros(n, bool), truncated=final, final=final,
                  episode_id=np.arange(n) // 12, step_index=(np.arange(n) % 12).astype(np.int32),
                  device_id=np.zeros(n, np.int32), actor_id=np.zeros(n, np.int32),
                  policy_incarnation=np.ones(n, np.int64), policy_count=np.zeros(n, np.int64),
                  source=np.zeros(n, np.uint8))
    replay = PersistentReplay(tmp_path / "replay", OBS, ACT, capacity=64, chunk_rows=32)
    replay.add(steps)
    replay.commit()
    batch = replay.sample(np.random.default_rng(1), 16, discount=0.99)
    assert batch["observation"][IMAGE].dtype == np.uint8
    rows = batch["reward"].astype(int)  # reward = row index: the image must be that row's
    np.testing.assert_array_equal(batch["observation"][IMAGE], images[rows])
    np.testing.assert_array_equal(batch["next_observation"][IMAGE], images[rows + 1])


@pytest.mark.parametrize("algo", ["ddpg", "sac"])
@pytest.mark.parametrize("pixels_only", [False, True])
def test_numpy_export_of_the_conv_encoder_matches_jax(tmp_path, algo, pixels_only):
    from dataclasses import replace

    from embodyrl.cli import export
    from embodyrl.hal import runtime

    encoder = replace(SMALL, pixels_only=pixels_only)
    if algo == "ddpg":
        config = ddpg.DDPGConfig(hidden_sizes=(16,), encoder=encoder)
        networks, actor, _ = ddpg.make_networks(OBS, ACT, config.hidden_sizes, jax.random.key(1), 1, encoder)
        jax_action = networks.policy
        exporter = export.export_ddpg
    else:
        config = sac.SACConfig(hidden_sizes=(16,), encoder=encoder)
        networks, actor, _ = sac.make_networks(OBS, ACT, config, jax.random.key(1))
        jax_action = networks.mean_action
        exporter = export.export_sac
    # LayerNorm starts at scale 1, bias 0: give it values that a wrong formula would show
    rng = np.random.default_rng(2)
    actor["encoder"]["norm"] = {k: jnp.asarray(rng.normal(size=v.shape), jnp.float32)
                                for k, v in actor["encoder"]["norm"].items()}
    graph, arrays = exporter(networks, actor, config)
    assert {"image", "conv2d", "flatten", "layer_norm"} <= {op["op"] for op in graph["graph"]}
    assert ("append" in {op["op"] for op in graph["graph"]}) is not pixels_only
    runtime.save(tmp_path / "policy", graph, arrays)
    policy = runtime.load(tmp_path / "policy")
    observation = _batch(5)["observation"]
    np.testing.assert_allclose(policy.mean_action(observation), np.asarray(jax_action(actor, observation)),
                               rtol=1e-4, atol=1e-4)
    single = jax.tree.map(lambda x: x[0], observation)  # one unbatched observation, as an actor sends
    np.testing.assert_allclose(policy.mean_action(single), np.asarray(jax_action(actor, observation))[0],
                               rtol=1e-4, atol=1e-4)
    policy.load_weights((1, 2), arrays)  # follows published weights by the learner's names
    bad = {**arrays, "actor/encoder/convs/0/kernel": np.zeros((3, 3, 5, 4), np.float32)}
    with pytest.raises(runtime.ExportError, match="convs/0/kernel"):
        runtime.NumpyPolicy(graph, bad)


def test_a_camera_image_is_not_flattened_into_the_mlp_by_accident():
    """Without an encoder an 84x84 camera would be a 21k-wide input layer: refused, naming the field and the fix."""
    camera = DictSpec.of(ArraySpec("camera/front", (84, 84, 3), np.uint8, 0, 255),
                         ArraySpec("orientation", (2,), np.float32))
    with pytest.raises(ValueError, match=r"'camera/front' is a camera image \(84x84x3 uint8\).*image_fields to \[auto\]"):
        sac.init(jax.random.key(0), camera, ACT, sac.SACConfig(hidden_sizes=(8,)))
    networks, _ = sac.init(jax.random.key(0), camera, ACT, sac.SACConfig(
        hidden_sizes=(8,), encoder=EncoderConfig(image_fields=("auto",), channels=(4,), strides=(2,))))
    assert networks.encoder is not None
    small = DictSpec.of(ArraySpec("grid", (4, 4, 3), np.uint8, 0, 255))  # a small uint8 grid still flattens
    assert sac.init(jax.random.key(0), small, ACT, sac.SACConfig(hidden_sizes=(8,)))[0].encoder is None
