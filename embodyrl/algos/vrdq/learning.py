"""VRDQ, Variance-Reduced Diffused Q-learning (Maity, Zhu, Mitra and Heath, ACC 2026, Algorithm 1).

N agents query the same MDP's generative model and talk only to their
neighbours. Time runs in epochs (:mod:`.schedule`). In epoch k every agent i

1. draws H_k next states for every (s, a) and builds its refined operator
   ``T_ik f(s, a) = R(s, a) + gamma sum_s' P_ik(s'|s, a) max_a' f(s', a')``
   from the empirical kernel P_ik (the paper's rewards are exact; with
   reward noise the H_k rewards' mean is used);
2. at the same time diffuses ``d_i = T_i,k-1 Q_i`` (the operator of the
   previous epoch, whose samples do not depend on Q_i) for L_k consensus
   rounds, ``d <- W d`` (W(t) redrawn every round on a time-varying network);
3. at the epoch's end updates ``Q_i <- (1 - alpha) Q_i + alpha d_i``.

The Q-table changes once an epoch, with a low-variance direction, so the
agents communicate once an epoch: K L rounds in all, logarithmic in the
samples, against one round per sample for per-sample consensus Q-learning
(:mod:`.per_sample`). The epoch is one jitted function over the stacked
agents; :mod:`.distributed` runs the same draws and arithmetic with each
agent in its own process.

Where this follows the paper and where it does not is said in
``docs/algorithms.md``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import schedule as schedules
from .graphs import adjacency, contraction, metropolis, random_mixing, time_varying_contraction


@dataclass(frozen=True)
class VRDQConfig:
    num_agents: int = 4
    topology: str = "ring"
    time_varying: bool = False
    """Redraw a connected random graph every consensus round (``topology`` is then ignored)."""
    epochs: str = "geometric"
    """``geometric`` (anytime, the default) or ``fixed`` (the paper's Theorem 1 for the budget)."""
    first_epoch: int = 8
    """Geometric epochs: H_0, samples per (s, a) in the first epoch."""
    growth: float | None = None
    """Geometric epochs: H_k = ceil(H_0 growth^k); None is 1 + (1 - gamma) / 2 (see :mod:`.schedule`)."""
    c1: float = 1.0
    """The paper's epoch constant: K = c1 log(NT) / (1 - gamma), alpha about 1 / c1."""
    c2: float = 1.0
    """The paper's diffusion constant in L."""
    max_rounds: int | None = None
    """Cap on consensus rounds per epoch (None: the paper's L, capped at the epoch's samples)."""
    pooled: int = 1
    """Each agent draws the samples of this many agents (1: its own). One agent with ``pooled=N``
    is the centralised baseline: one learner with all N agents' samples."""

    def __post_init__(self):
        if self.epochs not in ("geometric", "fixed"):
            raise ValueError(f"epochs must be 'geometric' or 'fixed', not {self.epochs!r}")
        if self.num_agents < 1 or self.pooled < 1 or self.first_epoch < 1:
            raise ValueError("num_agents, pooled and first_epoch must be at least 1")


class VRDQState(NamedTuple):
    q: jax.Array  # [agents, S, A]: Q_i at the start of this epoch
    counts: jax.Array  # [agents, S, A, S]: next-state counts of the previous epoch (zeros before the first)
    reward: jax.Array  # [agents, S, A]: R_i of the previous epoch (zeros before the first)
    epoch: jax.Array


class Trace(NamedTuple):
    """Per epoch: samples per (s, a) per agent drawn so far, rounds and messages so far, the error."""

    samples: list[int]
    rounds: list[int]
    messages: list[int]
    error: list[float]
    """Mean over agents of max |Q_i - Q*| at the epoch's end (the paper's E_K); empty without Q*."""


def mixing(config: VRDQConfig, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(adjacency, W, rho) of the static graph; if time-varying, of the first round's graph, and omega."""
    rng = np.random.default_rng(seed)
    if config.time_varying:
        A, W = random_mixing(config.num_agents, rng)
        return A, W, time_varying_contraction(config.num_agents, seed=seed)
    A = adjacency(config.topology, config.num_agents, rng)
    W = metropolis(A)
    return A, W, contraction(W)


def make_schedule(config: VRDQConfig, budget: int, discount: float, rho: float) -> schedules.Schedule:
    """The epochs for ``budget`` samples per (s, a) per agent (``N`` in the paper's formulas counts the
    samples pooled: an agent drawing for m agents is m agents' worth)."""
    n = config.num_agents * config.pooled
    if config.epochs == "fixed":
        return schedules.fixed(budget, n, discount, rho, config.c1, config.c2, config.max_rounds)
    return schedules.geometric(budget, n, discount, rho, config.first_epoch, config.growth, config.c1,
                               config.c2, config.max_rounds)


def draw(mdp, samples: int, seed: int, epoch: int, agent: int, pooled: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Agent ``agent``'s epoch: (next-state counts [S, A, S], mean reward [S, A]) of ``samples`` draws
    per (s, a), exactly distributed as that many generative-model queries (a multinomial; the mean
    of that many Gaussian rewards). Seeded by (run seed, epoch, agent id), so an agent in its own
    process draws what the in-process run draws for it; a pooled agent draws agents
    ``agent * pooled ...`` and adds them up."""
    counts, rewards = np.zeros(mdp.P.shape), np.zeros(mdp.R.shape)
    for member in range(agent * pooled, (agent + 1) * pooled):
        rng = np.random.default_rng([seed, epoch, member])
        counts += rng.multinomial(samples, mdp.P)
        rewards += mdp.R + rng.normal(size=mdp.R.shape) * mdp.reward_noise / np.sqrt(samples)
    return counts, rewards / pooled


def refined_operator(q: jax.Array, counts: jax.Array, reward: jax.Array, discount: float) -> jax.Array:
    """``T_i q`` with the empirical kernel ``counts / sum(counts)`` (zero before the first epoch)."""
    total = counts.sum(-1)
    kernel = counts / jnp.maximum(total, 1.0)[..., None]
    return reward + discount * kernel @ q.max(-1)


def init(num_agents: int, num_states: int, num_actions: int) -> VRDQState:
    return VRDQState(jnp.zeros((num_agents, num_states, num_actions)),
                     jnp.zeros((num_agents, num_states, num_actions, num_states)),
                     jnp.zeros((num_agents, num_states, num_actions)), jnp.zeros((), jnp.int32))


@functools.cache  # one compiled epoch per discount (and shape), shared by every run
def make_epoch(discount: float):
    """``epoch(state, M, counts, reward, alpha) -> state``, jitted: diffuse ``T_i,k-1 Q_i`` through M,
    the epoch's whole consensus (W^L, or the product of its rounds' W(t)), update Q, and keep this
    epoch's draws (``counts``, ``reward``: [agents, ...]) as the next epoch's operator."""

    @jax.jit
    def epoch(state: VRDQState, M: jax.Array, counts: jax.Array, reward: jax.Array, alpha: jax.Array) -> VRDQState:
        d = jax.vmap(refined_operator, in_axes=(0, 0, 0, None))(state.q, state.counts, state.reward, discount)
        d = jnp.tensordot(M, d, axes=1)
        return VRDQState((1.0 - alpha) * state.q + alpha * d, counts, reward, state.epoch + 1)

    return epoch


def consensus(config: VRDQConfig, W: np.ndarray, A: np.ndarray, rounds: int,
              rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """The epoch's mixing as one matrix, and the messages its rounds send (each agent to each neighbour)."""
    if rounds == 0:
        return np.eye(len(W)), 0
    if not config.time_varying:
        return np.linalg.matrix_power(W, rounds), rounds * int(A.sum())
    M, messages = np.eye(len(W)), 0
    for _ in range(rounds):
        A_t, W_t = random_mixing(len(W), rng)
        M, messages = W_t @ M, messages + int(A_t.sum())
    return M, messages


def run(mdp, config: VRDQConfig, budget: int, seed: int = 0,
        q_star: np.ndarray | None = None) -> tuple[VRDQState, Trace, schedules.Schedule]:
    """VRDQ with ``budget`` samples per (s, a) per agent; (final state, per-epoch trace, schedule)."""
    A, W, rho = mixing(config, seed)
    plan = make_schedule(config, budget, mdp.discount, rho)
    rng = np.random.default_rng(seed + 1)
    epoch = make_epoch(mdp.discount)
    state = init(config.num_agents, mdp.num_states, mdp.num_actions)
    trace = Trace([], [], [], [])
    rounds = messages = 0
    for k, (H, L, drawn) in enumerate(zip(plan.samples, plan.rounds, plan.cumulative_samples(), strict=True)):
        M, sent = consensus(config, W, A, L, rng)
        counts, reward = zip(*(draw(mdp, H, seed, k, i, config.pooled) for i in range(config.num_agents)),
                             strict=True)
        state = epoch(state, jnp.asarray(M, jnp.float32), jnp.asarray(np.stack(counts), jnp.float32),
                      jnp.asarray(np.stack(reward), jnp.float32), jnp.float32(plan.step))
        rounds, messages = rounds + L, messages + sent
        trace.samples.append(drawn)
        trace.rounds.append(rounds)
        trace.messages.append(messages)
        if q_star is not None:
            trace.error.append(float(jnp.mean(jnp.max(jnp.abs(state.q - q_star), axis=(1, 2)))))
    return state, trace, plan
