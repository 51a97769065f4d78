from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PPOConfig:
    hidden_sizes: tuple[int, ...] = (64, 64)
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
    """Asynchronous PPO: correct stale behaviour data with truncated importance weights (V-trace)."""
    rho_clip: float = 1.0
    """V-trace's rho-bar (truncation of the importance weight in the targets)."""
    c_clip: float = 1.0
    """V-trace's c-bar (truncation of the trace)."""
    min_ess_fraction: float = 0.5
    """When a batch's effective sample size falls below this fraction, the step shrinks in proportion."""
