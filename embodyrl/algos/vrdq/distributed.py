"""VRDQ with each agent on its own, mixing through an exchange with its neighbours.

The agent draws the same samples and computes the same operator as in
:func:`.learning.make_epoch` (keyed by run key, epoch and agent id); each
consensus round it sends its table to its neighbours and combines what they
sent with its row of the mixing matrix. Nothing passes through a centre. The
exchange is a function (:data:`~embodyrl.algos.consensus.Exchange`): the runner
(:func:`embodyrl.learner.consensus.run_agent`) plugs in peer links.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..consensus import Exchange, Traffic, no_traffic
from .learning import VRDQConfig, empirical_operator, sample_agent, step_size


def run_agent(agent: int, W: np.ndarray, exchange: Exchange, mdp, config: VRDQConfig, epochs: int,
              seed: int, traffic: Traffic = no_traffic) -> tuple[np.ndarray, dict]:
    """One agent's whole run; returns (its Q, what its exchange sent)."""
    neighbours = {int(j) for j in np.flatnonzero(W[agent]) if j != agent}
    key = jax.random.key(seed)
    P, R = jnp.asarray(mdp.P), jnp.asarray(mdp.R)
    operator = jax.jit(empirical_operator, static_argnums=3)
    q = np.zeros(mdp.R.shape)
    round_ = 0
    for epoch in range(epochs):
        next_states, rewards = sample_agent(P, R, mdp.reward_noise, config.samples_per_epoch, key, epoch, agent)
        y = np.asarray(operator(q, next_states, rewards, mdp.discount))
        for _ in range(config.consensus_rounds):
            got = exchange(round_, {"y": y}, neighbours)
            round_ += 1
            if set(got) != neighbours:
                raise TimeoutError(f"agent {agent}: neighbours {sorted(neighbours - set(got))} missed round {round_}")
            y = W[agent, agent] * y + sum(W[agent, j] * got[j]["y"] for j in neighbours)
        a = float(step_size(config, mdp.discount, epoch))
        q = (1.0 - a) * q + a * y
    return q, traffic()
