"""A VALID NHWC convolution whose gradient stays fast inside ``lax.scan`` on XLA:CPU.

Why: the learner runs K updates in one jitted ``lax.scan`` (a while loop).
XLA:CPU rewrites a convolution's two gradients (the kernel gradient, a
window-dilated convolution with batch and feature swapped; the input
gradient, a base-dilated one with a reversed kernel) into the canonical
NHWC/HWIO form its fast Eigen kernels need only outside while loops; inside
one they stay non-canonical and run as naive loops, about 8x slower (an
84x84x9 pixel update took 0.5 to 1.4 s per step instead of tens of ms).

Here the forward is the same ``lax.conv_general_dilated`` as ``nnx.Conv``
(canonical, fast everywhere); the backward is written as matrix products:

* kernel gradient: for each of the 3x3 taps, the transposed output
  gradient [O, N*OH*OW] times the tap's input pixels (a strided slice,
  [N*OH*OW, C]): one ``dot`` per tap;
* input gradient: the output gradient times the kernel gives each tap's
  contribution [N, OH, OW, kh, kw, C]; each tap is placed back with one
  ``lax.pad`` (interior padding = stride - 1) and summed.

Same mathematics as JAX's own conv gradient (equal to float32 rounding; a
test checks both against ``jax.grad`` of the plain convolution). Only the
CPU backend takes this path; GPUs keep cuDNN's gradients.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

_NHWC = ("NHWC", "HWIO", "NHWC")


def plain_conv(x: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
    """What ``nnx.Conv(padding="VALID")`` computes, without the bias: x [N, H, W, C], kernel HWIO."""
    return lax.conv_general_dilated(x, kernel, (stride, stride), "VALID", dimension_numbers=_NHWC)


def conv(x: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
    """:func:`plain_conv`, with the matrix-product gradient on the CPU backend."""
    if jax.default_backend() == "cpu":
        return matmul_grad_conv(x, kernel, stride)
    return plain_conv(x, kernel, stride)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul_grad_conv(x: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
    """:func:`plain_conv` whose gradients are matrix products (see the module docstring)."""
    return plain_conv(x, kernel, stride)


def _forward(x, kernel, stride):
    return plain_conv(x, kernel, stride), (x, kernel)


def _taps(x: jax.Array, row: int, col: int, stride: int, out_h: int, out_w: int) -> jax.Array:
    """The input pixels that kernel tap (row, col) meets at every output position: [N, OH, OW, C]."""
    end = (x.shape[0], row + stride * (out_h - 1) + 1, col + stride * (out_w - 1) + 1, x.shape[3])
    return lax.slice(x, (0, row, col, 0), end, (1, stride, stride, 1))


def _backward(stride, residuals, grad):
    x, kernel = residuals
    rows, cols, c_in, c_out = kernel.shape
    _, out_h, out_w, _ = grad.shape
    height, width = x.shape[1], x.shape[2]
    taps = [(r, c) for r in range(rows) for c in range(cols)]
    # grad^T [O, N*OH*OW] times each tap's pixels [N*OH*OW, C]: the long axis is the contraction, and
    # only the small output gradient is transposed (a concatenated [C*9, N*OH*OW] patch matrix cost
    # a transpose of the whole patch array)
    grad_t = grad.reshape(-1, c_out).T
    tap_grads = [grad_t @ _taps(x, r, c, stride, out_h, out_w).reshape(-1, c_in) for r, c in taps]
    d_kernel = jnp.stack(tap_grads).reshape(rows, cols, c_out, c_in).transpose(0, 1, 3, 2)
    per_tap = jnp.einsum("nijo,rcko->nijrck", grad, kernel)
    zero = jnp.zeros((), x.dtype)
    d_x = jnp.zeros_like(x)
    for r, c in taps:
        placement = [(0, 0, 0), (r, height - r - stride * (out_h - 1) - 1, stride - 1),
                     (c, width - c - stride * (out_w - 1) - 1, stride - 1), (0, 0, 0)]
        d_x = d_x + lax.pad(per_tap[:, :, :, r, c, :], zero, placement)
    return d_x, d_kernel


matmul_grad_conv.defvjp(_forward, _backward)
