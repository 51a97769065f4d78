"""The encoder's convolution: same forward as nnx.Conv, a matrix-product gradient equal to JAX's own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from embodyrl.algos.conv import conv, matmul_grad_conv, plain_conv
from embodyrl.algos.encoders import ConvEncoder, EncoderConfig


def _data(shape, c_out, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=shape), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(3, 3, shape[-1], c_out)) * 0.2, jnp.float32)
    return x, kernel


@pytest.mark.parametrize("shape,c_out,stride", [((3, 13, 11, 4), 5, 2), ((2, 9, 10, 3), 4, 1),
                                                 ((2, 16, 16, 9), 6, 2), ((1, 8, 8, 2), 3, 3)])
def test_gradients_equal_jax_own_conv_gradient(shape, c_out, stride):
    x, kernel = _data(shape, c_out)

    def loss(fn):
        return lambda x, k: jnp.sum(jnp.sin(fn(x, k, stride)) * jnp.arange(1.0, 1.0 + c_out))

    np.testing.assert_array_equal(matmul_grad_conv(x, kernel, stride), plain_conv(x, kernel, stride))
    want = jax.grad(loss(plain_conv), (0, 1))(x, kernel)
    got = jax.grad(loss(matmul_grad_conv), (0, 1))(x, kernel)
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert float(jnp.abs(got[1]).max()) > 0.1  # not a vacuous zero gradient


def test_gradient_inside_a_scan_equals_the_unscanned_one():
    """The path it exists for: K gradient steps on the kernel in one lax.scan (a while loop)."""
    x, kernel = _data((4, 2, 17, 17, 3), 4, seed=1)

    def step(fn):
        def body(k, xi):
            return k - 0.01 * jax.grad(lambda k: jnp.sum(jnp.tanh(fn(xi, k, 2)) ** 2))(k), None
        return body

    scanned = jax.jit(lambda k, x: jax.lax.scan(step(matmul_grad_conv), k, x)[0])(kernel, x)
    reference = kernel
    for xi in x:
        reference, _ = step(plain_conv)(reference, xi)
    np.testing.assert_allclose(scanned, reference, rtol=1e-4, atol=1e-5)
    assert not np.allclose(scanned, kernel)


def test_encoder_forward_is_nnx_conv_forward():
    config = EncoderConfig(channels=(4, 5), strides=(2, 1), feature_dim=6)
    encoder = ConvEncoder((15, 15, 6), config, rngs=nnx.Rngs(0))
    images = jnp.asarray(np.random.default_rng(2).uniform(size=(3, 15, 15, 6)), jnp.float32)
    x = images
    for layer in encoder.convs:  # nnx.Conv's own call, the reference
        x = jax.nn.relu(layer(x))
    want = jnp.tanh(encoder.norm(encoder.linear(x.reshape(3, -1))))
    np.testing.assert_allclose(encoder(images), want, rtol=1e-6, atol=1e-6)


def test_conv_dispatches_by_backend():
    x, kernel = _data((1, 7, 7, 2), 3)
    jaxpr = str(jax.make_jaxpr(lambda x, k: conv(x, k, 1))(x, kernel))
    assert ("custom_vjp" in jaxpr) == (jax.default_backend() == "cpu")
