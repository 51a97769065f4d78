from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PPOConfig:
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the policy and of the value network."""
    learning_rate: float = 3e-4
    discount: float = 0.99
    gae_lambda: float = 0.95
    clip_ratio: float = 0.2
    value_clip: float = 0.2
    """Clip the value update around the old value (0 disables)."""
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    epochs: int = 10
    minibatches: int = 32
    max_grad_norm: float = 0.5
    init_log_std: float = -0.5
    """Initial log std of the Gaussian policy (continuous actions)."""
    staleness_correction: bool = False
    """Correct behaviour data with truncated importance weights (V-trace) even when ``max_staleness`` is 0."""
    rho_clip: float = 1.0
    """V-trace's rho-bar (truncation of the importance weight in the targets)."""
    c_clip: float = 1.0
    """V-trace's c-bar (truncation of the trace)."""
    min_ess_fraction: float = 0.5
    """When a batch's effective sample size falls below this fraction, the step shrinks in proportion."""
    target_kl: float = 0.0
    """Stop an iteration's remaining minibatch steps once a minibatch's approximate KL from the
    iteration's starting policy exceeds 1.5 x this (0 disables)."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before the returns (keeps the value targets near unit scale)."""
    rollout_length: int = 128
    """Steps per rollout segment (T): the learner cuts each actor's step stream into segments of T."""
    rollouts_per_iteration: int = 8
    """Segments per PPO iteration (B): one iteration trains on a time-major [T, B] batch."""
    max_staleness: int = 0
    """Oldest data accepted, in iterations (publications) behind the learner: 0 is synchronous PPO
    (the learner waits for data of its current weights and discards older), k > 0 asynchronous
    (data up to k iterations old, corrected by V-trace from the behaviour log-probabilities)."""

    def __post_init__(self):
        if self.max_staleness < 0:
            raise ValueError("ppo.max_staleness must be 0 (synchronous) or a positive number of iterations")
        if self.rollout_length < 1 or self.rollouts_per_iteration < 1:
            raise ValueError("ppo.rollout_length and ppo.rollouts_per_iteration must be at least 1")
        if self.rollout_length * self.rollouts_per_iteration < self.minibatches:
            raise ValueError("ppo.minibatches: more minibatches than samples in an iteration "
                             f"({self.rollout_length} x {self.rollouts_per_iteration})")

    @property
    def corrects_staleness(self) -> bool:
        """Whether advantages come from V-trace (asynchronous) rather than GAE."""
        return self.staleness_correction or self.max_staleness > 0
