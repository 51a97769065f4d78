"""SAC's losses (Haarnoja et al. 2018, eqs. 5, 7, 18) with RLPD's ensemble options.

The critic's loss weights each sample's squared TD error by the batch's ``weight`` (prioritised
replay's importance weights; ones when the replay draws uniformly) and, given weights, returns
the per-sample ``td_error``, abs(Q - y) averaged over the ensemble, which the learner writes back
as priorities.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..encoders import detach
from ..scan import sample_weights
from .config import SACConfig
from .networks import SACNetworks


def td_target(networks: SACNetworks, config: SACConfig, actor_params, target_critic_params, alpha, batch, key):
    """y = r + discount * (min over a random subset of target critics - alpha log pi(a'|o'))."""
    sample_key, subset_key = jax.random.split(key)
    next_obs = batch["next_observation"]
    next_action, next_logp = networks.sample(actor_params, next_obs, sample_key)
    qs = networks.q_values(target_critic_params, next_obs, next_action)
    if config.num_min_critics < config.num_critics:
        subset = jax.random.choice(subset_key, config.num_critics, (config.num_min_critics,), replace=False)
        qs = qs[subset]
    next_v = jnp.min(qs, axis=0)
    if config.backup_entropy:
        next_v = next_v - alpha * next_logp
    return batch["reward"] + batch["discount"] * next_v


def make_losses(networks: SACNetworks, config: SACConfig):
    def critic_loss(critic_params, actor_params, target_critic_params, alpha, batch, key):
        y = jax.lax.stop_gradient(td_target(networks, config, actor_params, target_critic_params, alpha, batch, key))
        q = networks.q_values(critic_params, batch["observation"], batch["action"])
        per_sample = jnp.sum((q - y) ** 2, axis=0)  # weighted by prioritised replay (ones otherwise)
        aux = {"q_mean": jnp.mean(q), "target_mean": jnp.mean(y)}
        if "weight" in batch:  # prioritised: each sample's TD error is its new priority
            aux["td_error"] = jax.lax.stop_gradient(jnp.mean(jnp.abs(q - y), axis=0))
        return jnp.mean(sample_weights(batch) * per_sample), aux

    def actor_loss(actor_params, critic_params, alpha, batch, key):
        if networks.encoder is not None:  # the actor reads the critic's features, detached (DrQ)
            actor_params = detach(actor_params)
        action, logp = networks.sample(actor_params, batch["observation"], key)
        qs = networks.q_values(critic_params, batch["observation"], action)
        q = jnp.min(qs, axis=0) if config.actor_q == "min" else jnp.mean(qs, axis=0)
        # the target scales with each row's action dimensions (devices of different sizes share a batch)
        target = config.target_entropy_per_dim * jnp.mean(networks.action_dims(batch["observation"]))
        return jnp.mean(alpha * logp - q), {"entropy": -jnp.mean(logp), "target_entropy": target}

    def temperature_loss(log_alpha, entropy, target_entropy):
        """Automatic entropy tuning: raise alpha when the entropy falls below its target."""
        return log_alpha * jax.lax.stop_gradient(entropy - target_entropy)

    return critic_loss, actor_loss, temperature_loss
