"""Double DQN's n-step targets (van Hasselt et al. 2016, eq. 4; Sutton and Barto 7.1) and the TD loss.

A sampled transition carries the n-step return ``R = sum_{k<n} gamma^k r_{t+k}``
(fewer terms if the episode ended first), ``discount = gamma^m`` where m is the
number of steps summed, or 0 if the episode terminated within them (a
truncation still bootstraps), and the observation m steps later. The target
picks the next action with the online network and values it with the target
network: ``y = R + discount * Q_target(o', argmax_a Q_online(o', a))``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def double_q_targets(returns, discounts, next_q_online, next_q_target):
    """y for each transition; ``next_q_*`` are [..., num_actions]."""
    best = jnp.argmax(next_q_online, axis=-1)
    bootstrap = jnp.take_along_axis(next_q_target, best[..., None], axis=-1)[..., 0]
    return returns + discounts * bootstrap


def double_q_targets_loop(returns, discounts, next_q_online, next_q_target):
    """The same, one transition at a time (the reference the tests hold the vectorised form to)."""
    out = []
    for r, d, online, target in zip(returns, discounts, np.asarray(next_q_online), np.asarray(next_q_target),
                                    strict=True):
        out.append(r + d * target[int(np.argmax(online))])
    return np.asarray(out, np.float32)


def n_step_return(rewards, terminated, gamma: float, n: int):
    """(R, discount) of a transition starting at each index of one episode's ``rewards``, by definition."""
    rewards, terminated = np.asarray(rewards, np.float64), np.asarray(terminated, bool)
    T = len(rewards)
    R, D = np.zeros(T), np.zeros(T)
    for t in range(T):
        acc, scale = 0.0, 1.0
        for k in range(t, min(t + n, T)):
            acc += scale * rewards[k]
            scale *= gamma
            if terminated[k]:
                scale = 0.0
                break
        R[t], D[t] = acc, scale
    return R.astype(np.float32), D.astype(np.float32)


def td_loss(q_taken, targets, delta: float, weights=None):
    """Huber loss of the TD errors (targets held fixed), each weighted by ``weights`` (prioritised
    replay's importance weights; None: ones)."""
    err = q_taken - jax.lax.stop_gradient(targets)
    abs_err = jnp.abs(err)
    quadratic = jnp.minimum(abs_err, delta)
    huber = 0.5 * quadratic**2 + delta * (abs_err - quadratic)
    return jnp.mean(huber if weights is None else weights * huber)
