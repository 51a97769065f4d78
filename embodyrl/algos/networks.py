"""Building blocks shared by the algorithms' networks (Flax NNX)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..hal.specs import ArraySpec, DictSpec

LOG_2 = math.log(2.0)


class MLP(nnx.Module):
    """Dense layers with ReLU between them (LayerNorm before each ReLU if asked); the last layer is linear."""

    def __init__(self, in_size: int, hidden_sizes: Sequence[int], out_size: int, *, rngs: nnx.Rngs,
                 layer_norm: bool = False):
        sizes = [in_size, *hidden_sizes, out_size]
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:], strict=True)])
        self.norms = nnx.List([nnx.LayerNorm(h, rngs=rngs) for h in hidden_sizes]) if layer_norm else None

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, layer in enumerate(self.layers[:-1]):
            x = layer(x)
            if self.norms is not None:
                x = self.norms[i](x)
            x = jax.nn.relu(x)
        return self.layers[-1](x)


def squashed_gaussian(mean: jax.Array, log_std: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(tanh(u) in [-1, 1], log-density of each dimension of it) for u ~ N(mean, exp(log_std)),
    reparameterised; the caller sums the densities over the dimensions it counts (SAC's actor, a
    headed actor's own dimensions, CrossQ's)."""
    u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    gaussian = -0.5 * ((u - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)
    # log(1 - tanh(u)^2), written stably (SAC appendix C)
    squash = 2.0 * (LOG_2 - u - jax.nn.softplus(-2.0 * u))
    return jnp.tanh(u), gaussian - squash


def observation_size(spec: DictSpec) -> int:
    return sum(s.size for s in spec.specs)


def flatten_observation(observation: dict, spec: DictSpec) -> jax.Array:
    """Concatenate the fields (in the spec's order) into float32 [..., features]."""
    parts = []
    for s in spec.specs:
        x = jnp.asarray(observation[s.name], jnp.float32)
        parts.append(x.reshape(*x.shape[: x.ndim - len(s.shape)], s.size))
    return jnp.concatenate(parts, axis=-1)


class ActionScale:
    """Maps [-1, 1] to the action bounds and back (static numpy constants)."""

    def __init__(self, spec: ArraySpec):
        if not spec.bounded or not np.isfinite(spec.minimum).all() or not np.isfinite(spec.maximum).all():
            raise ValueError(f"{spec.name}: continuous control needs finite action bounds")
        self.center = ((spec.maximum + spec.minimum) / 2).astype(np.float32)
        self.half_range = ((spec.maximum - spec.minimum) / 2).astype(np.float32)

    def to_env(self, unit: jax.Array) -> jax.Array:
        return unit * self.half_range + self.center

    def to_unit(self, action: jax.Array) -> jax.Array:
        return (action - self.center) / self.half_range
