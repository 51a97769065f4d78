"""SAC's state, update and action selection: pure functions, jit-compiled by the caller."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from ...hal.specs import ArraySpec, DictSpec
from ..encoders import augment_batch, share
from ..scan import scanned
from .config import SACConfig
from .losses import make_losses
from .networks import SACNetworks, make_networks


class TrainingState(NamedTuple):
    actor_params: dict
    critic_params: dict
    target_critic_params: dict
    log_alpha: jax.Array
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    temperature_opt_state: optax.OptState
    key: jax.Array
    steps: jax.Array


def _optimizers(config: SACConfig):
    return optax.adam(config.actor_lr), optax.adam(config.critic_lr), optax.adam(config.temperature_lr)


def init(key: jax.Array, observation_spec: DictSpec, action_spec: ArraySpec,
         config: SACConfig) -> tuple[SACNetworks, TrainingState]:
    net_key, state_key = jax.random.split(key)
    networks, actor, critic = make_networks(observation_spec, action_spec, config, net_key)
    return networks, initial_state(state_key, actor, critic, config)


def initial_state(key: jax.Array, actor_params, critic_params, config: SACConfig) -> TrainingState:
    """The training state around fresh parameters (any networks with SAC's interface)."""
    actor_opt, critic_opt, temp_opt = _optimizers(config)
    log_alpha = jnp.asarray(jnp.log(config.init_temperature), jnp.float32)
    return TrainingState(actor_params, critic_params, jax.tree.map(jnp.copy, critic_params), log_alpha,
                         actor_opt.init(actor_params), critic_opt.init(critic_params), temp_opt.init(log_alpha),
                         key, jnp.zeros((), jnp.int32))


def make_update(networks: SACNetworks, config: SACConfig):
    actor_opt, critic_opt, temp_opt = _optimizers(config)
    critic_loss, actor_loss, temperature_loss = make_losses(networks, config)

    def update(state: TrainingState, batch) -> tuple[TrainingState, dict]:
        key, critic_key, actor_key = jax.random.split(state.key, 3)
        if networks.encoder is not None:
            batch = augment_batch(networks.encoder, batch, jax.random.fold_in(critic_key, 1))
        alpha = jnp.exp(state.log_alpha)
        (c_loss, c_aux), c_grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic_params, state.actor_params, state.target_critic_params, alpha, batch, critic_key)
        c_updates, critic_opt_state = critic_opt.update(c_grads, state.critic_opt_state)
        critic_params = optax.apply_updates(state.critic_params, c_updates)

        actor_before = state.actor_params
        if networks.encoder is not None:  # the actor reads the encoder the critic just trained
            actor_before = share(actor_before, critic_params)
        (a_loss, a_aux), a_grads = jax.value_and_grad(actor_loss, has_aux=True)(
            actor_before, critic_params, alpha, batch, actor_key)
        a_updates, actor_opt_state = actor_opt.update(a_grads, state.actor_opt_state)
        actor_params = optax.apply_updates(actor_before, a_updates)

        t_loss, t_grad = jax.value_and_grad(temperature_loss)(state.log_alpha, a_aux["entropy"],
                                                              a_aux["target_entropy"])
        t_update, temperature_opt_state = temp_opt.update(t_grad, state.temperature_opt_state)
        log_alpha = optax.apply_updates(state.log_alpha, t_update)

        new_state = TrainingState(
            actor_params, critic_params,
            optax.incremental_update(critic_params, state.target_critic_params, config.tau),
            log_alpha, actor_opt_state, critic_opt_state, temperature_opt_state, key, state.steps + 1)
        return new_state, {"critic_loss": c_loss, "actor_loss": a_loss, "temperature": alpha,
                           "temperature_loss": t_loss, **c_aux, **a_aux}

    return update


def make_update_many(networks: SACNetworks, config: SACConfig):
    """``update_many(state, batches)``: the update scanned over the batches' leading axis."""
    return scanned(make_update(networks, config))


def act(networks: SACNetworks, config: SACConfig, actor_params, observation, key: jax.Array,
        explore: bool = True) -> tuple[jax.Array, dict]:
    """A sample of the policy (exploring) or its mean action; ``log_prob`` of the
    applied action in the environment's units (for the step record)."""
    if not explore:
        return networks.mean_action(actor_params, observation), {}
    action, logp = networks.sample(actor_params, observation, key)
    return action, {"log_prob": logp - jnp.sum(jnp.log(networks.scale.half_range))}
