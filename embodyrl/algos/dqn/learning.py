"""Double DQN's state, update and action: pure functions over a state pytree, jitted by the caller.

``update_many(state, batches)`` scans K gradient steps over stacked batches
(``[K, batch, ...]``): each step regresses Q(o, a) on the double-Q n-step
target, and every ``target_period`` steps the target network takes the
online parameters. A batch is what every replay samples: ``observation``,
``action``, ``reward`` (the n-step return), ``discount`` (of its bootstrap)
and ``next_observation``, and with prioritised replay ``weight``, the importance weight of
each sample's Huber loss, and then the metrics carry each sample's ``td_error`` (its new priority).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from ...hal.specs import ArraySpec, DictSpec
from ..scan import sample_weights, scanned
from .config import DQNConfig
from .losses import double_q_targets, td_loss
from .networks import QNetworks, make_networks


class TrainingState(NamedTuple):
    params: dict
    target_params: dict
    opt_state: optax.OptState
    steps: jax.Array


def _optimizer(config: DQNConfig):
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.learning_rate))


def init(key: jax.Array, observation_spec: DictSpec, action_spec: ArraySpec,
         config: DQNConfig) -> tuple[QNetworks, TrainingState]:
    networks, params = make_networks(observation_spec, action_spec, config.hidden_sizes, key)
    target = jax.tree.map(jnp.copy, params)  # its own buffers: the learner donates the whole state to each update
    return networks, TrainingState(params, target, _optimizer(config).init(params), jnp.zeros((), jnp.int32))


def act(networks: QNetworks, params, observation, key, epsilon):
    """Epsilon-greedy actions for a batch of observations: uniform with probability ``epsilon``."""
    q = networks.q_values(params, observation)
    greedy = jnp.argmax(q, axis=-1)
    explore_key, action_key = jax.random.split(key)
    random = jax.random.randint(action_key, greedy.shape, 0, networks.num_actions)
    return jnp.where(jax.random.uniform(explore_key, greedy.shape) < epsilon, random, greedy)


def make_update_many(networks: QNetworks, config: DQNConfig):
    optimizer = _optimizer(config)

    def loss_fn(params, target_params, batch):
        q = networks.q_values(params, batch["observation"])
        q_taken = jnp.take_along_axis(q, batch["action"].astype(jnp.int32)[..., None], -1)[..., 0]
        targets = double_q_targets(batch["reward"], batch["discount"],
                                   networks.q_values(params, batch["next_observation"]),
                                   networks.q_values(target_params, batch["next_observation"]))
        loss = td_loss(q_taken, targets, config.huber_delta, sample_weights(batch))
        return loss, (jnp.mean(q_taken), jax.lax.stop_gradient(jnp.abs(q_taken - targets)))

    def step(state: TrainingState, batch):
        (loss, (q_mean, td_error)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.target_params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        steps = state.steps + 1
        refresh = steps % config.target_period == 0
        target = jax.tree.map(lambda p, t: jnp.where(refresh, p, t), params, state.target_params)
        metrics = {"td_loss": loss, "q_mean": q_mean}
        if "weight" in batch:  # prioritised: each sample's TD error is its new priority
            metrics["td_error"] = td_error
        return TrainingState(params, target, opt_state, steps), metrics

    return scanned(step)
