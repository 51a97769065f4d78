"""Tabular MDPs with known dynamics: the testbed for distributed Q-learning.

``P[s, a, s']`` transition probabilities and ``R[s, a]`` expected rewards
(rewards are drawn as ``R + noise`` when sampled). :func:`q_star` solves
the Bellman optimality equation exactly by value iteration, so algorithms
can be scored by their distance to Q*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TabularMDP:
    P: np.ndarray
    """[states, actions, states] transition probabilities (rows sum to 1)."""
    R: np.ndarray
    """[states, actions] expected rewards."""
    discount: float
    reward_noise: float = 0.0
    """Std of the Gaussian noise on sampled rewards."""

    def __post_init__(self):
        if not np.allclose(self.P.sum(-1), 1.0):
            raise ValueError("transition probabilities must sum to 1 over next states")
        if self.R.shape != self.P.shape[:2]:
            raise ValueError(f"R has shape {self.R.shape}, P needs {self.P.shape[:2]}")

    @property
    def num_states(self) -> int:
        return self.P.shape[0]

    @property
    def num_actions(self) -> int:
        return self.P.shape[1]

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` generative-model samples for every (s, a): (next states [S, A, n], rewards [S, A, n])."""
        S, A = self.num_states, self.num_actions
        cdf = np.cumsum(self.P, axis=-1)
        u = rng.random((S, A, n, 1))
        next_states = np.minimum((u > cdf[:, :, None, :]).sum(-1), S - 1)
        rewards = self.R[:, :, None] + self.reward_noise * rng.normal(size=(S, A, n))
        return next_states, rewards


def bellman(mdp: TabularMDP, q: np.ndarray) -> np.ndarray:
    """The exact Bellman optimality operator T(Q) = R + gamma P max_a' Q."""
    return mdp.R + mdp.discount * mdp.P @ q.max(axis=-1)


def q_star(mdp: TabularMDP, tol: float = 1e-12) -> np.ndarray:
    """Q* by value iteration (a gamma-contraction, so it converges geometrically)."""
    q = np.zeros_like(mdp.R)
    while True:
        new = bellman(mdp, q)
        if np.max(np.abs(new - q)) < tol:
            return new
        q = new


def grid_world(size: int = 4, slip: float = 0.2, discount: float = 0.9, reward_noise: float = 1.0) -> TabularMDP:
    """A ``size`` x ``size`` grid; actions up/down/left/right move with probability
    ``1 - slip`` and to a random neighbour otherwise; reaching the far corner pays 1
    and restarts at the near corner; every other step costs 0.01."""
    S, A = size * size, 4
    moves = [(-1, 0), (1, 0), (0, -1), (0, 1)]
    goal = S - 1

    def move(s, m):
        r, c = divmod(s, size)
        r, c = min(max(r + m[0], 0), size - 1), min(max(c + m[1], 0), size - 1)
        return r * size + c

    P = np.zeros((S, A, S))
    R = np.full((S, A), -0.01)
    for s in range(S):
        for a in range(A):
            if s == goal:
                P[s, a, 0] = 1.0
                R[s, a] = 1.0
                continue
            P[s, a, move(s, moves[a])] += 1 - slip
            for m in moves:
                P[s, a, move(s, m)] += slip / len(moves)
    return TabularMDP(P, R, discount, reward_noise)


def random_mdp(num_states: int = 10, num_actions: int = 5, discount: float = 0.9, seed: int = 0,
               reward_noise: float = 0.0) -> TabularMDP:
    """The VRDQ paper's kind of MDP: random transitions (Dirichlet(1) rows, i.e. uniform on the
    simplex), rewards uniform in [0, 1] and exact (no noise) unless ``reward_noise``."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(num_states), size=(num_states, num_actions))
    return TabularMDP(P, rng.random((num_states, num_actions)), discount, reward_noise)
