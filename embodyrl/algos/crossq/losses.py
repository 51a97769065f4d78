"""CrossQ's losses: SAC's (Haarnoja et al. 2018), the critics trained without target networks.

The critic's loss passes the batch's (o, a) and (o', a') through the critics as one batch in training
mode, so both halves are normalised with the same moments (Bhatt et al. 2024, eq. 4), and takes its
target from the second half, gradient stopped. It weights each sample by the batch's ``weight``
(prioritised replay) and then returns the per-sample ``td_error`` as SAC's does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..scan import sample_weights
from .networks import CrossQNetworks


def make_losses(networks: CrossQNetworks):
    """(critic_loss, actor_loss); each returns (loss, (the network's new statistics, aux))."""

    def critic_loss(critic_params, state, alpha, batch, key):
        """``state``: the training state (its actor acts for the targets; its critic statistics move)."""
        (mean, log_std), _ = networks.distribution(state.actor_params, state.actor_stats,
                                                   batch["next_observation"])
        next_action, next_logp = networks.sample_from(mean, log_std, key)
        joint = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), batch["observation"], batch["next_observation"])
        qs, stats = networks.q_values(critic_params, state.critic_stats, joint,
                                      jnp.concatenate([batch["action"], next_action]), train=True)
        q, next_qs = jnp.split(qs, 2, axis=1)
        next_v = jnp.min(jax.lax.stop_gradient(next_qs), axis=0) - alpha * next_logp
        y = batch["reward"] + batch["discount"] * next_v
        per_sample = jnp.sum((q - y) ** 2, axis=0)
        aux = {"q_mean": jnp.mean(q), "target_mean": jnp.mean(y)}
        if "weight" in batch:  # prioritised: each sample's TD error is its new priority
            aux["td_error"] = jax.lax.stop_gradient(jnp.mean(jnp.abs(q - y), axis=0))
        return jnp.mean(sample_weights(batch) * per_sample), (stats, aux)

    def actor_loss(params, actor_stats, critic_params, critic_stats, alpha, batch, key):
        (mean, log_std), stats = networks.distribution(params, actor_stats, batch["observation"], train=True)
        action, logp = networks.sample_from(mean, log_std, key)
        qs, _ = networks.q_values(critic_params, critic_stats, batch["observation"], action)
        return jnp.mean(alpha * logp - jnp.min(qs, axis=0)), (stats, -jnp.mean(logp))

    return critic_loss, actor_loss
