"""CrossQ's state, update and action selection (Bhatt et al. 2024): SAC's losses with batch-renormalised
critics and no target networks (:mod:`.losses`). Pure functions, jit-compiled by the caller. Every
step moves the critics; every ``policy_delay``-th also the actor and the temperature.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from ...hal.specs import ArraySpec, DictSpec
from ..scan import scanned
from .config import CrossQConfig
from .losses import make_losses
from .networks import CrossQNetworks, acting, make_networks


class TrainingState(NamedTuple):
    actor_params: dict
    actor_stats: dict
    critic_params: dict
    critic_stats: dict
    log_alpha: jax.Array
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    temperature_opt_state: optax.OptState
    key: jax.Array
    steps: jax.Array
    actor_metrics: jax.Array
    """(actor loss, temperature loss, entropy) of the last actor step: what the steps between report."""


def _optimizers(config: CrossQConfig):
    return (optax.adam(config.actor_lr, b1=config.adam_b1), optax.adam(config.critic_lr, b1=config.adam_b1),
            optax.adam(config.temperature_lr))


def init(key: jax.Array, observation_spec: DictSpec, action_spec: ArraySpec,
         config: CrossQConfig) -> tuple[CrossQNetworks, TrainingState]:
    net_key, state_key = jax.random.split(key)
    networks, actor, actor_stats, critic, critic_stats = make_networks(observation_spec, action_spec, config,
                                                                       net_key)
    actor_opt, critic_opt, temp_opt = _optimizers(config)
    log_alpha = jnp.asarray(jnp.log(config.init_temperature), jnp.float32)
    return networks, TrainingState(actor, actor_stats, critic, critic_stats, log_alpha, actor_opt.init(actor),
                                   critic_opt.init(critic), temp_opt.init(log_alpha), state_key,
                                   jnp.zeros((), jnp.int32), jnp.zeros(3, jnp.float32))


def actor_params(state: TrainingState) -> dict:
    """What the learner publishes: the actor's layers and norms with their running moments."""
    return acting(state.actor_params, state.actor_stats)


def make_update(networks: CrossQNetworks, config: CrossQConfig):
    actor_opt, critic_opt, temp_opt = _optimizers(config)

    critic_loss, actor_loss = make_losses(networks)
    target_entropy = config.target_entropy_per_dim * networks.action_spec.size

    def update(state: TrainingState, batch) -> tuple[TrainingState, dict]:
        key, critic_key, actor_key = jax.random.split(state.key, 3)
        alpha = jnp.exp(state.log_alpha)
        (c_loss, (critic_stats, c_aux)), c_grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic_params, state, alpha, batch, critic_key)
        c_updates, critic_opt_state = critic_opt.update(c_grads, state.critic_opt_state)
        critic_params = optax.apply_updates(state.critic_params, c_updates)
        state = state._replace(critic_params=critic_params, critic_stats=critic_stats,
                               critic_opt_state=critic_opt_state, key=key, steps=state.steps + 1)

        def actor_step(state):
            (a_loss, (actor_stats, entropy)), a_grads = jax.value_and_grad(actor_loss, has_aux=True)(
                state.actor_params, state.actor_stats, state.critic_params, state.critic_stats, alpha, batch,
                actor_key)
            a_updates, actor_opt_state = actor_opt.update(a_grads, state.actor_opt_state)
            t_loss, t_grad = jax.value_and_grad(lambda la: la * jax.lax.stop_gradient(entropy - target_entropy))(
                state.log_alpha)
            t_update, temperature_opt_state = temp_opt.update(t_grad, state.temperature_opt_state)
            return state._replace(actor_params=optax.apply_updates(state.actor_params, a_updates),
                                  actor_stats=actor_stats, actor_opt_state=actor_opt_state,
                                  log_alpha=optax.apply_updates(state.log_alpha, t_update),
                                  temperature_opt_state=temperature_opt_state,
                                  actor_metrics=jnp.stack([a_loss, t_loss, entropy]).astype(jnp.float32))

        # between actor steps nothing is computed for the actor: the last step's losses are reported
        # (a forward pass of the critics for the metrics alone cost 15 to 25 % of an update)
        state = jax.lax.cond(state.steps % config.policy_delay == 0, actor_step, lambda state: state, state)
        a_loss, t_loss, entropy = state.actor_metrics
        return state, {"critic_loss": c_loss, "actor_loss": a_loss, "temperature": alpha,
                       "temperature_loss": t_loss, "entropy": entropy, "target_entropy": target_entropy, **c_aux}

    return update


def make_update_many(networks: CrossQNetworks, config: CrossQConfig):
    """``update_many(state, batches)``: the update scanned over the batches' leading axis."""
    return scanned(make_update(networks, config))


def act(networks: CrossQNetworks, config: CrossQConfig, actor, observation, key: jax.Array,
        explore: bool = True) -> tuple[jax.Array, dict]:
    """A sample of the policy (exploring) or its mean action, from an :func:`acting` actor; ``log_prob``
    of the applied action in the environment's units (for the step record)."""
    if not explore:
        return networks.mean_action(actor, observation), {}
    action, logp = networks.sample(actor, observation, key)
    return action, {"log_prob": logp - jnp.sum(jnp.log(networks.scale.half_range))}
