"""VRDQ with each agent in its own process, mixing over peer links.

The agent draws the same samples and computes the same operator as in
:func:`.learning.make_epoch` (keyed by run key, epoch and agent id); each
consensus round it sends its table to its neighbours and combines what they
sent with its row of the mixing matrix. Nothing passes through a centre.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...transport.peers import PeerLink
from .learning import VRDQConfig, empirical_operator, sample_agent, step_size


def run_agent(agent: int, W: np.ndarray, endpoints: dict[int, str], mdp, config: VRDQConfig, epochs: int,
              seed: int, round_timeout_s: float = 30.0) -> tuple[np.ndarray, dict]:
    """One agent's whole run; returns (its Q, its link statistics)."""
    neighbours = {int(j) for j in np.flatnonzero(W[agent]) if j != agent}
    link = PeerLink(agent, bind=endpoints[agent])
    link.connect({j: endpoints[j] for j in neighbours})
    key = jax.random.key(seed)
    P, R = jnp.asarray(mdp.P), jnp.asarray(mdp.R)
    operator = jax.jit(empirical_operator, static_argnums=3)
    q = np.zeros(mdp.R.shape)
    round_ = 0
    try:
        for epoch in range(epochs):
            next_states, rewards = sample_agent(P, R, mdp.reward_noise, config.samples_per_epoch, key, epoch, agent)
            y = np.asarray(operator(q, next_states, rewards, mdp.discount))
            for _ in range(config.consensus_rounds):
                got = link.exchange(round_, {"y": y}, expect=neighbours, timeout_s=round_timeout_s)
                round_ += 1
                if set(got) != neighbours:
                    raise TimeoutError(f"agent {agent}: neighbours {sorted(neighbours - set(got))} missed round {round_}")
                y = W[agent, agent] * y + sum(W[agent, j] * got[j]["y"] for j in neighbours)
            a = float(step_size(config, mdp.discount, epoch))
            q = (1.0 - a) * q + a * y
    finally:
        link.close()
    return q, {"messages_out": link.stats.messages_out, "bytes_out": link.stats.bytes_out}
