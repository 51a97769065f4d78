"""Pixel SAC with the encoder's matrix-product conv gradient computes what it computed with lax.conv's own."""

from unittest import mock

import jax
import numpy as np

from embodyrl.algos import conv, encoders, sac
from embodyrl.algos.encoders import EncoderConfig
from embodyrl.hal.specs import ArraySpec, DictSpec

IMAGE = "camera/front"
OBS = DictSpec.of(ArraySpec(IMAGE, (20, 20, 6), np.uint8, 0, 255))
ACT = ArraySpec("action", (1,), np.float32, -2.0, 2.0)
CONFIG = sac.SACConfig(hidden_sizes=(16,), batch_size=8, encoder=EncoderConfig(
    image_fields=(IMAGE,), pixels_only=True, channels=(4, 4), strides=(2, 1), feature_dim=8, augment_pad=2))
K = 3


def _batches():
    rng = np.random.default_rng(0)

    def images():
        return {IMAGE: rng.integers(0, 256, (K, 8, 20, 20, 6), dtype=np.uint8)}

    return {"observation": images(), "next_observation": images(),
            "action": rng.uniform(-2, 2, (K, 8, 1)).astype(np.float32),
            "reward": rng.normal(size=(K, 8)).astype(np.float32), "discount": np.full((K, 8), 0.9, np.float32)}


def _scanned_update(conv_fn):
    networks, state = sac.init(jax.random.key(0), OBS, ACT, CONFIG)
    with mock.patch.object(encoders, "conv2d", conv_fn):  # traced inside the patch
        return jax.jit(sac.make_update_many(networks, CONFIG))(state, _batches())


def test_scanned_pixel_updates_equal_those_with_the_plain_conv_gradient():
    (new, new_metrics), (old, old_metrics) = _scanned_update(conv.conv), _scanned_update(conv.plain_conv)
    start = sac.init(jax.random.key(0), OBS, ACT, CONFIG)[1]
    kernel = ("encoder", "convs", 0, "kernel")

    def leaf(params, path):
        for p in path:
            params = params[p]
        return np.asarray(params)

    moved = leaf(new.critic_params, kernel) - leaf(start.critic_params, kernel)
    assert np.abs(moved).max() > 1e-4  # the encoder did train
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5), new.critic_params, old.critic_params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5), new.actor_params, old.actor_params)
    for name in ("critic_loss", "actor_loss", "q_mean"):
        np.testing.assert_allclose(new_metrics[name], old_metrics[name], rtol=1e-4, atol=1e-5)
