"""Double DQN's settings (one learner; the distributed ones add :class:`ConsensusConfig`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DQNConfig:
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the Q-network's hidden layers."""
    learning_rate: float = 1e-3
    """Adam's step size."""
    discount: float = 0.99
    """gamma; an n-step return discounts its bootstrap by gamma^n, and not at all past a termination."""
    n_step: int = 3
    """Rewards summed before bootstrapping (through truncation, never through termination)."""
    batch_size: int = 64
    target_period: int = 250
    """Gradient steps between copies of the online network into the target network."""
    max_grad_norm: float = 10.0
    huber_delta: float = 1.0
    """The TD error's Huber loss is quadratic within this distance, linear beyond."""
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_decay_steps: int = 10_000
    """Env steps over which epsilon-greedy exploration falls linearly from start to end."""
    updates_per_call: int = 8
    """Gradient steps fused into one jitted ``lax.scan`` call."""

    def __post_init__(self):
        if self.n_step < 1 or self.batch_size < 1 or self.target_period < 1:
            raise ValueError("dqn: n_step, batch_size and target_period must be at least 1")
        if not 0.0 <= self.epsilon_end <= self.epsilon_start <= 1.0:
            raise ValueError("dqn: need 0 <= epsilon_end <= epsilon_start <= 1")

    def epsilon(self, env_steps: int) -> float:
        frac = min(1.0, env_steps / max(1, self.epsilon_decay_steps))
        return self.epsilon_start + frac * (self.epsilon_end - self.epsilon_start)
