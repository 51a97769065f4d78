from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from ..encoder_config import EncoderConfig

SECTION = "ddpg"
"""The TrainConfig section holding these settings (for both of the package's registry names)."""


@dataclass(frozen=True)
class DDPGConfig:
    past_defaults: ClassVar[dict[str, object]] = {"delay_targets": True, "actor_q": "first"}
    """What runs saved before a key existed did (its default changed): read where config.json lacks it."""

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
    num_critics: int = 1
    """TD3's twin critics: 2 (the target takes their minimum)."""
    target_noise: float = 0.0
    """TD3's target policy smoothing: std of the noise on the target action (fraction of half range)."""
    target_noise_clip: float = 0.5
    """Bound of that noise (fraction of half range)."""
    policy_delay: int = 1
    """TD3's delayed updates: the actor moves every ``policy_delay`` critic steps."""
    delay_targets: bool = False
    """The target networks move with the actor, every ``policy_delay`` steps (Fujimoto's TD3, SB3);
    False: after every critic step (SBX)."""
    actor_q: str = "min"
    """What the actor ascends: the ``first`` critic (DDPG, Fujimoto's TD3) or the ``min`` over them (SBX)."""
    bc_weight: float = 0.0
    """Behaviour cloning in the actor's loss (TD3+BC, Fujimoto & Gu 2021): Q divided by its batch's
    mean magnitude, plus this weight times the mean squared distance (in half ranges) to the batch's
    actions; 0: plain DDPG. It holds a policy near what acted (demonstrations, or the policy a
    run started from) while its critic is still unsure; TD3+BC's alpha of 2.5 is 0.4 here."""
    actor_starts_after: int = 0
    """Critic steps before the actor's first step: a policy that starts from one that already acts
    well (a warm start) is not moved by a critic fitted to its first few batches."""
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    """The convolutional encoder used when the observation has camera images (DrQ)."""

    def __post_init__(self):
        if self.num_critics < 1 or self.policy_delay < 1:
            raise ValueError("num_critics and policy_delay must be at least 1")
        if self.actor_starts_after < 0:
            raise ValueError(f"actor_starts_after must be 0 or more, got {self.actor_starts_after}")
        if not self.bc_weight >= 0:
            raise ValueError(f"bc_weight must be 0 or more, got {self.bc_weight}")
        if self.actor_q not in ("first", "min"):
            raise ValueError(f"actor_q must be 'first' or 'min', got {self.actor_q!r}")


def td3(config: DDPGConfig = DDPGConfig()) -> DDPGConfig:
    """DDPG with all of TD3's options (Fujimoto et al. 2018): twin critics, smoothing, delay 2."""
    return replace(config, num_critics=2, target_noise=0.2, target_noise_clip=0.5, policy_delay=2)
