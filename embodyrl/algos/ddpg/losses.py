"""DDPG's losses (Lillicrap et al. 2016, eqs. 4-6 in Algorithm 1).

The batch carries ``discount``: the full bootstrap factor gamma^n for an
n-step return, 0 where the episode terminated inside it, and gamma^n where it
was merely truncated (the time limit is not a terminal state).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .networks import DDPGNetworks


def td_target(networks: DDPGNetworks, target_actor_params, target_critic_params, batch) -> jax.Array:
    """y = r + discount * Q'(o', mu'(o'))."""
    next_obs = batch["next_observation"]
    next_action = networks.policy(target_actor_params, next_obs)
    next_q = networks.q_value(target_critic_params, next_obs, next_action)
    return batch["reward"] + batch["discount"] * next_q


def make_losses(networks: DDPGNetworks):
    def critic_loss(critic_params, target_actor_params, target_critic_params, batch):
        """Mean squared TD error against the fixed target y."""
        y = jax.lax.stop_gradient(td_target(networks, target_actor_params, target_critic_params, batch))
        q = networks.q_value(critic_params, batch["observation"], batch["action"])
        return jnp.mean((q - y) ** 2), {"q_mean": jnp.mean(q), "target_mean": jnp.mean(y)}

    def actor_loss(actor_params, critic_params, batch):
        """-Q(o, mu(o)): the deterministic policy gradient."""
        action = networks.policy(actor_params, batch["observation"])
        return -jnp.mean(networks.q_value(critic_params, batch["observation"], action))

    return critic_loss, actor_loss
