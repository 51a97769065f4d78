"""DDPG's losses (Lillicrap et al. 2016, Algorithm 1) with TD3's options (Fujimoto et al. 2018).

The batch carries ``discount``: the full bootstrap factor gamma^n for an
n-step return, 0 where the episode terminated inside it, and gamma^n where it
was merely truncated (the time limit is not a terminal state), and may carry
``weight``: prioritised replay's importance weights (Schaul et al. 2016, Algorithm 1
line 10), which scale each sample's squared TD error in the critic's loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..encoders import detach
from ..scan import sample_weights
from .config import DDPGConfig
from .networks import DDPGNetworks


def target_action(networks: DDPGNetworks, config: DDPGConfig, target_actor_params, observation, key):
    """mu'(o'), plus TD3's clipped smoothing noise when enabled (TD3 eq. 15)."""
    action = networks.policy(target_actor_params, observation)
    if config.target_noise > 0:
        half = networks.scale.half_range
        noise = jnp.clip(jax.random.normal(key, action.shape) * config.target_noise,
                         -config.target_noise_clip, config.target_noise_clip)
        action = jnp.clip(action + noise * half, networks.scale.center - half, networks.scale.center + half)
    return action


def td_target(networks: DDPGNetworks, config: DDPGConfig, target_actor_params, target_critic_params,
              batch, key) -> jax.Array:
    """y = r + discount * min_i Q'_i(o', a') (a single critic: plain DDPG)."""
    next_obs = batch["next_observation"]
    next_action = target_action(networks, config, target_actor_params, next_obs, key)
    next_q = jnp.min(networks.q_values(target_critic_params, next_obs, next_action), axis=0)
    return batch["reward"] + batch["discount"] * next_q


def make_losses(networks: DDPGNetworks, config: DDPGConfig):
    def critic_loss(critic_params, target_actor_params, target_critic_params, batch, key):
        """Squared TD error of every critic against the shared target y, each sample weighted by
        its importance weight (prioritised replay; ones otherwise). With weights it also returns
        the per-sample ``td_error``: abs(Q - y), averaged over the critics (the sample's new priority)."""
        y = jax.lax.stop_gradient(td_target(networks, config, target_actor_params, target_critic_params, batch, key))
        q = networks.q_values(critic_params, batch["observation"], batch["action"])
        per_sample = jnp.sum((q - y) ** 2, axis=0)
        aux = {"q_mean": jnp.mean(q[0]), "target_mean": jnp.mean(y)}
        if "weight" in batch:  # prioritised: each sample's TD error is its new priority
            aux["td_error"] = jax.lax.stop_gradient(jnp.mean(jnp.abs(q - y), axis=0))
        return jnp.mean(sample_weights(batch) * per_sample), aux

    def actor_loss(actor_params, critic_params, batch):
        """-Q_1(o, mu(o)) (or -min_i Q_i): the deterministic policy gradient (the encoder's features
        detached); with ``bc_weight``, TD3+BC's: that Q normalised, plus the weighted squared distance
        to the batch's actions."""
        if networks.encoder is not None:
            actor_params = detach(actor_params)
        action = networks.policy(actor_params, batch["observation"])
        qs = networks.q_values(critic_params, batch["observation"], action)
        q = qs[0] if config.actor_q == "first" else jnp.min(qs, axis=0)
        if config.bc_weight == 0:
            return -jnp.mean(q)
        # TD3+BC (Fujimoto & Gu 2021, eq. 3): Q in units of its mean magnitude, so that the weight
        # means the same whatever the rewards' scale; the distance in half ranges of the action
        distance = ((action - batch["action"]) / networks.scale.half_range) ** 2
        return -jnp.mean(q) / jax.lax.stop_gradient(jnp.mean(jnp.abs(q)) + 1e-6) + \
            config.bc_weight * jnp.mean(distance)

    return critic_loss, actor_loss
