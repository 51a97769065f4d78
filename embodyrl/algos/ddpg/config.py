from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DDPGConfig:
    hidden_sizes: tuple[int, ...] = (256, 256)
    """Widths of the actor's and the critic's hidden layers."""
    actor_lr: float = 3e-4
    critic_lr: float = 1e-3
    discount: float = 0.99
    """gamma; the replay's per-step discount is 0 at termination, 1 at truncation."""
    tau: float = 0.005
    """Polyak step of the target networks."""
    exploration_noise: float = 0.1
    """Std of the Gaussian action noise, as a fraction of the half action range."""
    batch_size: int = 256
