"""Communication graphs and their mixing matrices for consensus.

Mixing matrices use Metropolis-Hastings weights, ``W_ij = 1 / (1 +
max(d_i, d_j))`` for neighbours and the rest on the diagonal: symmetric and
doubly stochastic on any connected undirected graph, so repeated mixing
converges to the agents' average.
"""

from __future__ import annotations

import numpy as np

TOPOLOGIES = ("ring", "star", "complete", "random")


def adjacency(topology: str, n: int, rng: np.random.Generator | None = None, p: float = 0.3) -> np.ndarray:
    """Symmetric 0/1 adjacency without self-loops; ``random`` is Erdos-Renyi, redrawn until connected."""
    A = np.zeros((n, n), bool)
    if n == 1:
        return A
    if topology == "ring":
        for i in range(n):
            A[i, (i + 1) % n] = A[(i + 1) % n, i] = True
    elif topology == "star":
        A[0, 1:] = A[1:, 0] = True
    elif topology == "complete":
        A[:] = True
    elif topology == "random":
        rng = rng or np.random.default_rng()
        while True:
            upper = np.triu(rng.random((n, n)) < p, 1)
            A = upper | upper.T
            if connected(A):
                break
    else:
        raise ValueError(f"unknown topology {topology!r}; known: {', '.join(TOPOLOGIES)}")
    np.fill_diagonal(A, False)
    return A


def connected(A: np.ndarray) -> bool:
    seen, frontier = {0}, [0]
    while frontier:
        i = frontier.pop()
        for j in np.flatnonzero(A[i]):
            if j not in seen:
                seen.add(int(j))
                frontier.append(int(j))
    return len(seen) == len(A)


def metropolis(A: np.ndarray) -> np.ndarray:
    degree = A.sum(1)
    W = np.where(A, 1.0 / (1.0 + np.maximum(degree[:, None], degree[None, :])), 0.0)
    np.fill_diagonal(W, 1.0 - W.sum(1))
    return W


def spectral_gap(W: np.ndarray) -> float:
    """1 - second largest |eigenvalue|: how fast mixing reaches the average."""
    return 1.0 - contraction(W)


def contraction(W: np.ndarray) -> float:
    """rho = ||W - 11'/N||_2, the second largest |eigenvalue| of a symmetric doubly stochastic W:
    each round shrinks the agents' disagreement at least by this factor (the paper's rho)."""
    n = len(W)
    if n == 1:
        return 0.0
    return float(np.max(np.abs(np.linalg.eigvalsh(W - np.full((n, n), 1.0 / n)))))


def random_mixing(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One round's graph of a time-varying network: (adjacency, Metropolis W) of a connected random graph."""
    A = adjacency("random", n, rng)
    return A, metropolis(A)


def time_varying_contraction(n: int, draws: int = 64, seed: int = 0) -> float:
    """omega for a network whose graph is redrawn every round (the paper's Assumption 1 with B = 1):
    the largest contraction over ``draws`` graphs, an estimate of the supremum."""
    rng = np.random.default_rng(seed)
    return max(contraction(random_mixing(n, rng)[1]) for _ in range(draws))
