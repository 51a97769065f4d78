"""PPO's state, iteration update and action selection: pure functions, jit-compiled by the caller.

One ``update`` is one PPO iteration on a time-major rollout batch ``[T, B,
...]``: advantages (GAE, or V-trace when the behaviour policy may be stale),
then ``epochs`` passes of ``minibatches`` clipped-surrogate steps, all in one
``lax.scan``. With staleness correction, the effective sample size of the
batch's importance weights is measured and the step shrinks when it
collapses.

Truncation is not termination: a batch may carry ``truncated`` [T, B] and
``next_observation`` [T, B, ...]; where an episode was cut by its time
limit, gamma V(o_T+1) is folded into the reward and the discount set to 0,
so the return bootstraps from the episode's own last observation rather
than the next episode's first one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from ...hal.specs import ArraySpec, DictSpec
from ..scan import keep_finite
from .config import PPOConfig
from .losses import clipped_surrogate, effective_sample_size, gae, value_loss, vtrace
from .networks import PPONetworks, make_networks


class TrainingState(NamedTuple):
    params: dict
    opt_state: optax.OptState
    key: jax.Array
    iterations: jax.Array


def _optimizer(config: PPOConfig):
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.learning_rate))


def init(key: jax.Array, observation_spec: DictSpec, action_spec: ArraySpec,
         config: PPOConfig) -> tuple[PPONetworks, TrainingState]:
    net_key, state_key = jax.random.split(key)
    networks, params = make_networks(observation_spec, action_spec, config, net_key)
    return networks, TrainingState(params, _optimizer(config).init(params), state_key, jnp.zeros((), jnp.int32))


def act(networks: PPONetworks, config: PPOConfig, params, observation, key, explore: bool = True):
    """(action, extras) with the log-probability and value the update needs later."""
    action = networks.sample(params, observation, key) if explore else networks.mode(params, observation)
    return action, {"log_prob": networks.log_prob(params, observation, action),
                    "value": networks.value(params, observation)}


def actor_params(params) -> dict:
    """What an actor needs to act: the policy (and the Gaussian's log std), not the value network."""
    return {k: v for k, v in params.items() if k != "value"}


def act_with_log_prob(networks: PPONetworks, params, observation, key, explore: bool = True):
    """The actor's step: (action, {"log_prob"}) from actor parameters alone (no value network)."""
    action = networks.sample(params, observation, key) if explore else networks.mode(params, observation)
    return action, {"log_prob": networks.log_prob(params, observation, action)}


def make_update(networks: PPONetworks, config: PPOConfig):
    optimizer = _optimizer(config)

    def targets(params, batch):
        values = networks.value(params, batch["observation"])
        bootstrap = networks.value(params, batch["bootstrap_observation"])
        logp = networks.log_prob(params, batch["observation"], batch["action"])
        log_rhos = logp - batch["behaviour_log_prob"]
        rewards, discounts = batch["reward"] * config.reward_scale, batch["discount"]
        if "truncated" in batch:  # bootstrap through the time limit from the episode's own last observation
            cut = batch["truncated"].astype(jnp.float32)
            rewards = rewards + cut * config.discount * networks.value(params, batch["next_observation"])
            discounts = discounts * (1.0 - cut)
        if config.corrects_staleness:
            returns, advantages = vtrace(rewards, values, discounts, bootstrap, log_rhos,
                                         config.rho_clip, config.c_clip)
        else:
            advantages, returns = gae(rewards, values, discounts, bootstrap, config.gae_lambda)
        ess = effective_sample_size(log_rhos.reshape(-1)) / log_rhos.size
        return advantages, returns, values, logp, ess

    def loss_fn(params, mb):
        logp = networks.log_prob(params, mb["observation"], mb["action"])
        adv = (mb["advantage"] - mb["advantage"].mean()) / (mb["advantage"].std() + 1e-8)
        pg_loss, clip_fraction = clipped_surrogate(logp - mb["old_log_prob"], adv, config.clip_ratio)
        v_loss = value_loss(networks.value(params, mb["observation"]), mb["old_value"], mb["return"],
                            config.value_clip)
        entropy = jnp.mean(networks.entropy(params, mb["observation"]))
        loss = pg_loss + config.value_coef * v_loss - config.entropy_coef * entropy
        approx_kl = jnp.mean(mb["old_log_prob"] - logp)
        return loss, {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy,
                      "clip_fraction": clip_fraction, "approx_kl": approx_kl}

    def update(state: TrainingState, batch) -> tuple[TrainingState, dict]:
        advantages, returns, values, logp, ess = targets(state.params, batch)
        lr_scale = jnp.minimum(1.0, ess / config.min_ess_fraction) if config.corrects_staleness else 1.0
        flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), {
            "observation": batch["observation"], "action": batch["action"], "advantage": advantages,
            "return": returns, "old_value": values, "old_log_prob": logp})
        n = advantages.size
        size = n // config.minibatches
        key, perm_key = jax.random.split(state.key)
        perms = jax.vmap(lambda k: jax.random.permutation(k, n))(jax.random.split(perm_key, config.epochs))
        order = perms[:, : size * config.minibatches].reshape(-1, size)

        def step(carry, idx):
            params, opt_state, stopped = carry
            mb = jax.tree.map(lambda x: x[idx], flat)
            (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
            if config.target_kl > 0:  # early stop: this and every later step of the iteration move nothing
                stopped = stopped | (metrics["approx_kl"] > 1.5 * config.target_kl)
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
            updates = jax.tree.map(lambda u: u * lr_scale * (1.0 - stopped), updates)
            opt_state = jax.tree.map(lambda new, old: jnp.where(stopped, old, new), new_opt_state, opt_state)
            metrics["minibatch_steps"] = 1.0 - stopped.astype(jnp.float32)
            return (optax.apply_updates(params, updates), opt_state, stopped), metrics

        carry = (state.params, state.opt_state, jnp.zeros((), bool))
        (params, opt_state, _), metrics = jax.lax.scan(step, carry, order)
        steps_taken = jnp.sum(metrics.pop("minibatch_steps"))
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics.update(ess_fraction=ess, lr_scale=jnp.asarray(lr_scale, jnp.float32), minibatch_steps=steps_taken)
        return TrainingState(params, opt_state, key, state.iterations + 1), metrics

    # a non-finite iteration (a diverged or absurd batch) is refused whole: the previous weights stay published
    return keep_finite(update)
