"""VRDQ's schedule: how many samples each epoch draws, how many consensus rounds it runs, the step size.

The paper (Maity, Zhu, Mitra and Heath, "Variance-Reduced Q-Learning over
Static and Time-Varying Networks", ACC 2026, Theorem 1) fixes a budget of
T samples per (s, a) per agent and chooses

* K = ceil(c1 log(NT) / (1 - gamma)) epochs of H = T / K samples each;
* the step size alpha = log(NT) / ((1 - gamma) K), about 1 / c1;
* L = ceil(log(c2 N^1.5 sqrt(T) / sqrt(1 - gamma)) / log(1 / rho)) consensus
  rounds in each epoch, run during the epoch's first L sample steps (so
  L <= H), with rho the contraction of the mixing matrix (omega over a
  time-varying network, Theorem 2).

Communication is K L rounds: O(log^2(NT)) for the budget, O(log(NT)) where
one round is exact (rho = 0, the complete graph). ``epochs="fixed"`` is that
schedule. It needs T in advance, and along one run its epochs are equal, so
messages grow linearly with the samples drawn so far. ``epochs="geometric"``
(the default) is its anytime form: epoch k draws ceil(H0 g^k) samples, with
g = 1 + (1 - gamma) / 2 by default, so after n samples there have been about
2 log(n) / (1 - gamma) epochs, the paper's K for that n with c1 = 2; each
epoch's L is the paper's formula at the samples drawn so far. The bias
shrinks by (1 - alpha (1 - gamma)) = gamma an epoch, so with this g it falls
like 1/n^2, far below the statistical error's 1/sqrt(Nn) even at N = 100,
while the last epoch still holds (g - 1)/g, about a twentieth, of the samples.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    samples: tuple[int, ...]
    """H_k: samples per (s, a) per agent drawn in epoch k."""
    rounds: tuple[int, ...]
    """L_k: consensus rounds in epoch k (0 in epoch 0: there is nothing to diffuse yet)."""
    step: float
    """alpha: Q_i <- (1 - alpha) Q_i + alpha d_i at the end of every epoch."""

    @property
    def epochs(self) -> int:
        return len(self.samples)

    def cumulative_samples(self) -> list[int]:
        return list(itertools.accumulate(self.samples))


def rounds_for(num_agents: int, samples: int, discount: float, rho: float, c2: float = 1.0) -> int:
    """The paper's L for ``samples`` per agent: enough rounds that rho^L N^1.5 sqrt(T) stays bounded."""
    if num_agents == 1:
        return 0
    if rho <= 1e-12:  # one round is the exact average
        return 1
    if rho >= 1.0:
        raise ValueError("the mixing matrix does not contract (is the graph connected?)")
    need = math.log(max(1.0, c2 * num_agents ** 1.5 * math.sqrt(samples) / math.sqrt(1.0 - discount)))
    return max(1, math.ceil(need / math.log(1.0 / rho)))


def fixed(budget: int, num_agents: int, discount: float, rho: float, c1: float = 1.0, c2: float = 1.0,
          max_rounds: int | None = None) -> Schedule:
    """The paper's Theorem 1 for a budget of ``budget`` samples per (s, a) per agent."""
    log_nt = math.log(num_agents * budget)
    K = min(budget, max(1, math.ceil(c1 * log_nt / (1.0 - discount))))
    H = budget // K
    L = _cap(rounds_for(num_agents, budget, discount, rho, c2), H, max_rounds)
    return Schedule((H,) * K, (0,) + (L,) * (K - 1), min(1.0, log_nt / ((1.0 - discount) * K)))


def geometric(budget: int, num_agents: int, discount: float, rho: float, first: int = 8,
              growth: float | None = None, c1: float = 1.0, c2: float = 1.0,
              max_rounds: int | None = None) -> Schedule:
    """Epochs of ceil(first g^k) samples until ``budget`` (the last one cut to fit)."""
    g = 1.0 + (1.0 - discount) / 2.0 if growth is None else growth
    if g < 1.0:
        raise ValueError(f"epochs must not shrink: growth {g} < 1")
    samples, rounds, drawn, k = [], [], 0, 0
    while drawn < budget:
        h = min(math.ceil(first * g**k), budget - drawn)
        rounds.append(0 if k == 0 else _cap(rounds_for(num_agents, drawn, discount, rho, c2), h, max_rounds))
        samples.append(h)
        drawn += h
        k += 1
    return Schedule(tuple(samples), tuple(rounds), min(1.0, 1.0 / c1))


def _cap(rounds: int, epoch_samples: int, max_rounds: int | None) -> int:
    """Rounds run during the epoch's first sample steps, one a step: at most H (and ``max_rounds``)."""
    return min(rounds, epoch_samples, max_rounds if max_rounds is not None else rounds)
