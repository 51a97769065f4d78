"""PPO's pieces: GAE (Schulman et al. 2016, eq. 16), the clipped surrogate
(Schulman et al. 2017, eq. 7), value clipping, V-trace (Espeholt et al. 2018,
eq. 1) and the effective sample size of importance weights.

Time runs along axis 0. ``discount`` is gamma where the episode went on or
was truncated, 0 where it terminated; ``bootstrap_value`` is V of the
observation after the last step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def gae(rewards, values, discounts, bootstrap_value, lam: float):
    """(advantages, returns) by a reverse ``lax.scan``."""
    next_values = jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = rewards + discounts * next_values - values

    def step(carry, x):
        delta, discount = x
        carry = delta + discount * lam * carry
        return carry, carry

    _, advantages = jax.lax.scan(step, jnp.zeros_like(bootstrap_value), (deltas, discounts), reverse=True)
    return advantages, advantages + values


def gae_loop(rewards, values, discounts, bootstrap_value, lam: float):
    """The same by a plain Python loop (the reference the tests hold the scan to)."""
    rewards, values, discounts = map(np.asarray, (rewards, values, discounts))
    advantages = np.zeros_like(values)
    carry = np.zeros_like(np.asarray(bootstrap_value))
    next_value = np.asarray(bootstrap_value)
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + discounts[t] * next_value - values[t]
        carry = delta + discounts[t] * lam * carry
        advantages[t] = carry
        next_value = values[t]
    return advantages, advantages + values


def vtrace(rewards, values, discounts, bootstrap_value, log_rhos, rho_clip: float = 1.0, c_clip: float = 1.0):
    """V-trace targets v_s and policy-gradient advantages for stale behaviour data.

    ``log_rhos`` = log pi(a|o) - log mu(a|o), mu the behaviour policy that acted.
    """
    rhos = jnp.exp(log_rhos)
    clipped_rhos = jnp.minimum(rho_clip, rhos)
    cs = jnp.minimum(c_clip, rhos)
    next_values = jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)

    def step(carry, x):
        delta, discount, c = x
        carry = delta + discount * c * carry
        return carry, carry

    _, corrections = jax.lax.scan(step, jnp.zeros_like(bootstrap_value), (deltas, discounts, cs), reverse=True)
    vs = values + corrections
    next_vs = jnp.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    advantages = clipped_rhos * (rewards + discounts * next_vs - values)
    return vs, advantages


def vtrace_loop(rewards, values, discounts, bootstrap_value, log_rhos, rho_clip=1.0, c_clip=1.0):
    """V-trace written directly from its definition: v_s = V(x_s) + sum_t gamma^(t-s)
    (prod_{i<t} c_i) rho_t delta_t."""
    rewards, values, discounts, log_rhos = map(np.asarray, (rewards, values, discounts, log_rhos))
    T = len(rewards)
    rhos = np.exp(log_rhos)
    next_values = np.concatenate([values[1:], np.asarray(bootstrap_value)[None]], 0)
    deltas = np.minimum(rho_clip, rhos) * (rewards + discounts * next_values - values)
    vs = np.array(values, dtype=np.float64)
    for s in range(T):
        acc, scale = 0.0, 1.0
        for t in range(s, T):
            acc = acc + scale * deltas[t]
            scale = scale * discounts[t] * np.minimum(c_clip, rhos[t])
        vs[s] = values[s] + acc
    next_vs = np.concatenate([vs[1:], np.asarray(bootstrap_value)[None]], 0)
    return vs, np.minimum(rho_clip, rhos) * (rewards + discounts * next_vs - values)


def clipped_surrogate(log_ratio, advantages, clip_ratio: float):
    """-mean(min(r A, clip(r, 1 - eps, 1 + eps) A)), and the fraction clipped. The log-ratio is
    bounded at +-20 before the exponential (far inside the clipped region) so it never overflows."""
    ratio = jnp.exp(jnp.clip(log_ratio, -20.0, 20.0))
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1 - clip_ratio, 1 + clip_ratio) * advantages
    return -jnp.mean(jnp.minimum(unclipped, clipped)), jnp.mean(jnp.abs(ratio - 1) > clip_ratio)


def value_loss(values, old_values, returns, value_clip: float):
    """Squared error, clipped around the old values as in PPO's reference code."""
    if value_clip <= 0:
        return 0.5 * jnp.mean((values - returns) ** 2)
    clipped = old_values + jnp.clip(values - old_values, -value_clip, value_clip)
    return 0.5 * jnp.mean(jnp.maximum((values - returns) ** 2, (clipped - returns) ** 2))


def effective_sample_size(log_weights) -> jax.Array:
    """(sum w)^2 / sum w^2: how many samples the importance-weighted batch is worth."""
    w = jnp.exp(log_weights - jnp.max(log_weights))
    return jnp.sum(w) ** 2 / jnp.sum(w**2)
