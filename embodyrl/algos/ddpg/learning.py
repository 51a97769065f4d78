"""DDPG/TD3 state, update and action selection: pure functions, jit-compiled by the caller."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from ...hal.specs import ArraySpec, DictSpec
from ..encoders import augment_batch, share
from ..scan import scanned
from .config import DDPGConfig
from .losses import make_losses
from .networks import DDPGNetworks, make_networks


class TrainingState(NamedTuple):
    actor_params: dict
    critic_params: dict
    target_actor_params: dict
    target_critic_params: dict
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    key: jax.Array
    steps: jax.Array


def _optimizers(config: DDPGConfig):
    return optax.adam(config.actor_lr), optax.adam(config.critic_lr)


def init(key: jax.Array, observation_spec: DictSpec, action_spec: ArraySpec,
         config: DDPGConfig) -> tuple[DDPGNetworks, TrainingState]:
    net_key, state_key = jax.random.split(key)
    networks, actor, critic = make_networks(observation_spec, action_spec, config.hidden_sizes, net_key,
                                            config.num_critics, config.encoder)
    return networks, initial_state(state_key, actor, critic, config)


def initial_state(key: jax.Array, actor_params, critic_params, config: DDPGConfig) -> TrainingState:
    """The training state around fresh parameters (any networks with DDPG's interface)."""
    actor_opt, critic_opt = _optimizers(config)
    return TrainingState(
        actor_params=actor_params, critic_params=critic_params,
        target_actor_params=jax.tree.map(jnp.copy, actor_params),
        target_critic_params=jax.tree.map(jnp.copy, critic_params),
        actor_opt_state=actor_opt.init(actor_params), critic_opt_state=critic_opt.init(critic_params),
        key=key, steps=jnp.zeros((), jnp.int32))


def _select(flag, new, old):
    return jax.tree.map(lambda a, b: jnp.where(flag, a, b), new, old)


def make_update(networks: DDPGNetworks, config: DDPGConfig):
    """``update(state, batch) -> (state, metrics)``: a critic step, and every
    ``policy_delay`` steps (from step ``actor_starts_after``) an actor step and a target update."""
    actor_opt, critic_opt = _optimizers(config)
    critic_loss, actor_loss = make_losses(networks, config)

    def update(state: TrainingState, batch) -> tuple[TrainingState, dict]:
        key, noise_key = jax.random.split(state.key)
        if networks.encoder is not None:
            batch = augment_batch(networks.encoder, batch, jax.random.fold_in(noise_key, 1))
        (c_loss, c_aux), c_grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic_params, state.target_actor_params, state.target_critic_params, batch, noise_key)
        c_updates, critic_opt_state = critic_opt.update(c_grads, state.critic_opt_state)
        critic_params = optax.apply_updates(state.critic_params, c_updates)

        actor_before = state.actor_params
        if networks.encoder is not None:  # the actor reads the encoder the critic just trained
            actor_before = share(actor_before, critic_params)
        move = ((state.steps % config.policy_delay) == 0) & (state.steps >= config.actor_starts_after)

        def actor_step(_):
            a_loss, a_grads = jax.value_and_grad(actor_loss)(actor_before, critic_params, batch)
            a_updates, opt_state = actor_opt.update(a_grads, state.actor_opt_state)
            return optax.apply_updates(actor_before, a_updates), opt_state, a_loss

        def actor_waits(_):  # the loss alone (a forward pass) keeps the metric every step
            return actor_before, state.actor_opt_state, actor_loss(actor_before, critic_params, batch)

        # a conditional, not a select: the actor's gradient is computed only on the steps it moves
        actor_params, actor_opt_state, a_loss = jax.lax.cond(move, actor_step, actor_waits, None)
        move_targets = move if config.delay_targets else True
        target_actor = _select(move_targets, optax.incremental_update(actor_params, state.target_actor_params,
                                                                      config.tau), state.target_actor_params)
        target_critic = _select(move_targets, optax.incremental_update(critic_params, state.target_critic_params,
                                                                       config.tau), state.target_critic_params)
        new_state = TrainingState(
            actor_params=actor_params, critic_params=critic_params,
            target_actor_params=target_actor, target_critic_params=target_critic,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state, key=key, steps=state.steps + 1)
        return new_state, {"critic_loss": c_loss, "actor_loss": a_loss, **c_aux}

    return update


def make_update_many(networks: DDPGNetworks, config: DDPGConfig):
    """``update_many(state, batches)``: the update scanned over the batches' leading axis."""
    return scanned(make_update(networks, config))


def act(networks: DDPGNetworks, config: DDPGConfig, actor_params, observation, key: jax.Array,
        explore: bool = True) -> tuple[jax.Array, dict]:
    """mu(o) plus Gaussian noise (when exploring), clipped to the bounds."""
    action = networks.policy(actor_params, observation)
    if explore:
        noise = jax.random.normal(key, action.shape) * config.exploration_noise
        action = action + noise * networks.scale.half_range
    lo = networks.scale.center - networks.scale.half_range
    hi = networks.scale.center + networks.scale.half_range
    return jnp.clip(action, lo, hi), {}
