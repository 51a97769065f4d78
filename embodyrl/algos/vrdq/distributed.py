"""VRDQ with each agent on its own, diffusing through an exchange with its neighbours.

The agent draws the same samples and does the same arithmetic as
:func:`.learning.run` does for it (seeded by run seed, epoch and agent id):
each epoch it sends ``d = T_i,k-1 Q_i`` to its neighbours for the schedule's
L_k rounds, combining what they sent with its row of W, then updates Q once.
Nothing passes through a centre. The exchange is a function
(:data:`~embodyrl.algos.consensus.Exchange`): the runner
(:func:`embodyrl.learner.consensus.run_agent`) plugs in peer links. Static
graphs only: on a time-varying network every agent would need each round's
graph.
"""

from __future__ import annotations

import numpy as np

from ..consensus import Exchange, Traffic, no_traffic
from .graphs import contraction
from .learning import VRDQConfig, draw, make_schedule, refined_operator


def run_agent(agent: int, W: np.ndarray, exchange: Exchange, mdp, config: VRDQConfig, budget: int,
              seed: int, traffic: Traffic = no_traffic) -> tuple[np.ndarray, dict]:
    """One agent's whole run with ``budget`` samples per (s, a); returns (its Q, what its exchange sent)."""
    if config.time_varying:
        raise ValueError("a VRDQ agent in its own process needs a static graph (time_varying=False)")
    neighbours = {int(j) for j in np.flatnonzero(W[agent]) if j != agent}
    plan = make_schedule(config, budget, mdp.discount, contraction(W))
    q = np.zeros(mdp.R.shape, np.float32)
    counts, reward = np.zeros(mdp.P.shape, np.float32), np.zeros(mdp.R.shape, np.float32)
    round_ = 0
    for k, (H, L) in enumerate(zip(plan.samples, plan.rounds, strict=True)):
        d = np.asarray(refined_operator(q, counts, reward, mdp.discount))
        for _ in range(L):
            got = exchange(round_, {"d": d}, neighbours)
            round_ += 1
            if set(got) != neighbours:
                raise TimeoutError(f"agent {agent}: neighbours {sorted(neighbours - set(got))} missed round {round_}")
            d = W[agent, agent] * d + sum(W[agent, j] * got[j]["d"] for j in neighbours)
        q = ((1.0 - plan.step) * q + plan.step * d).astype(np.float32)
        counts, reward = (x.astype(np.float32) for x in draw(mdp, H, seed, k, agent, config.pooled))
    return q, traffic()
