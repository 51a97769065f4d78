"""Per-sample consensus Q-learning: the usual distributed Q-learning, kept to compare VRDQ against.

Not the VRDQ of the paper (:mod:`.learning` is): here every epoch is one
sample per (s, a), so there are as many communication phases as samples
(O(T) messages), and the step size decays like 1/k, so the bias shrinks no
faster than 1/k whatever the number of agents. Each epoch, every agent i

1. draws its own ``samples_per_epoch`` transitions for every (s, a) and builds
   the empirical Bellman operator ``T_i(Q)(s, a) = mean_k [r_k + gamma max_a' Q(s'_k, a')]``;
2. applies it to its own estimate: ``Y_i = T_i(Q_i)``;
3. mixes with its neighbours for ``consensus_rounds`` rounds, ``Y <- W Y``
   (W doubly stochastic on the communication graph), which drives every
   ``Y_i`` toward the average of the agents' operators: an estimate with
   1/M of the variance of one agent's;
4. relaxes: ``Q_i <- (1 - a_k) Q_i + a_k Y_i`` with the rescaled linear step
   ``a_k = 1 / (1 + (1 - gamma) k)``.

Messages per epoch: every round, every agent sends its |S||A| table to each
neighbour: ``rounds * sum(degrees)``. With a time-varying graph a new random
graph is drawn each epoch. The epoch is one jitted function over the stacked
agents; the same :func:`empirical_operator` and :func:`mix` serve agents that
run as separate processes over peer links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .graphs import adjacency, metropolis


@dataclass(frozen=True)
class PerSampleConfig:
    num_agents: int = 4
    samples_per_epoch: int = 1
    """Transitions each agent draws per (s, a) per epoch."""
    consensus_rounds: int = 3
    """L: mixing rounds per epoch."""
    topology: str = "ring"
    time_varying: bool = False
    """Draw a new random graph every epoch (topology must be 'random')."""
    step_scale: float = 1.0
    """a_k = step_scale / (1 + (1 - gamma) k)."""


class PerSampleState(NamedTuple):
    q: jax.Array  # [agents, states, actions]
    key: jax.Array
    epoch: jax.Array
    messages: jax.Array


def init(key: jax.Array, num_states: int, num_actions: int, config: PerSampleConfig) -> PerSampleState:
    return PerSampleState(jnp.zeros((config.num_agents, num_states, num_actions)), key,
                     jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int64 if jax.config.x64_enabled else jnp.int32))


def empirical_operator(q: jax.Array, next_states: jax.Array, rewards: jax.Array, discount: float) -> jax.Array:
    """T_i(Q) from one agent's samples: next_states, rewards of shape [S, A, n]."""
    return jnp.mean(rewards + discount * q.max(axis=-1)[next_states], axis=-1)


def mix(W: jax.Array, y: jax.Array, rounds: int) -> jax.Array:
    """``rounds`` consensus rounds over the stacked agents' tables ``y`` [agents, ...]."""
    def one(y, _):
        return jnp.tensordot(W, y, axes=1), None

    return jax.lax.scan(one, y, None, length=rounds)[0]


def messages_per_epoch(A: np.ndarray, rounds: int) -> int:
    return int(rounds * A.sum())


def sample_agent(P: jax.Array, R: jax.Array, reward_noise: float, n: int, key: jax.Array, epoch, agent: int):
    """Agent ``agent``'s samples for ``epoch``: (next states, rewards), each [S, A, n].

    Keyed by (run key, epoch, agent) so an agent in its own process draws
    exactly what the in-process simulation draws for it.
    """
    k_next, k_reward = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, epoch), agent))
    S, A_ = R.shape
    logits = jnp.log(jnp.maximum(P, 1e-30))
    next_states = jax.random.categorical(k_next, logits[:, :, None, :], shape=(S, A_, n))
    rewards = R[:, :, None] + reward_noise * jax.random.normal(k_reward, (S, A_, n))
    return next_states, rewards


def step_size(config: PerSampleConfig, discount: float, epoch) -> jax.Array:
    return config.step_scale / (1.0 + (1.0 - discount) * epoch)


def make_epoch(P: np.ndarray, R: np.ndarray, discount: float, reward_noise: float, config: PerSampleConfig):
    """``epoch(state, W, messages) -> state``: one VRDQ epoch for all agents, jit-compiled."""
    P, R = jnp.asarray(P), jnp.asarray(R)
    n = config.samples_per_epoch

    @jax.jit
    def epoch(state: PerSampleState, W: jax.Array, messages: int) -> PerSampleState:
        agents = jnp.arange(state.q.shape[0])
        next_states, rewards = jax.vmap(sample_agent, in_axes=(None, None, None, None, None, None, 0))(
            P, R, reward_noise, n, state.key, state.epoch, agents)
        y = jax.vmap(empirical_operator, in_axes=(0, 0, 0, None))(state.q, next_states, rewards, discount)
        y = mix(W, y, config.consensus_rounds)
        a = step_size(config, discount, state.epoch)
        return PerSampleState((1.0 - a) * state.q + a * y, state.key, state.epoch + 1, state.messages + messages)

    return epoch


def run(mdp, config: PerSampleConfig, epochs: int, seed: int = 0, q_star: np.ndarray | None = None):
    """Run ``epochs`` epochs; returns (state, per-epoch mean max-norm error to ``q_star`` or None)."""
    rng = np.random.default_rng(seed)
    state = init(jax.random.key(seed), mdp.num_states, mdp.num_actions, config)
    epoch = make_epoch(mdp.P, mdp.R, mdp.discount, mdp.reward_noise, config)
    A = adjacency(config.topology, config.num_agents, rng)
    W = jnp.asarray(metropolis(A))
    errors = []
    for _ in range(epochs):
        if config.time_varying:
            A = adjacency("random", config.num_agents, rng)
            W = jnp.asarray(metropolis(A))
        state = epoch(state, W, messages_per_epoch(A, config.consensus_rounds))
        if q_star is not None:
            errors.append(float(jnp.mean(jnp.max(jnp.abs(state.q - q_star), axis=(1, 2)))))
    return state, errors
