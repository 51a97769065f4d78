from __future__ import annotations

from dataclasses import dataclass, field

from ..encoder_config import EncoderConfig

SECTION = "crossq"
"""The TrainConfig section holding these settings."""


@dataclass(frozen=True)
class CrossQConfig:
    """CrossQ's settings (Bhatt et al. 2024; the paper's and SBX's values as defaults)."""

    hidden_sizes: tuple[int, ...] = (256, 256)
    """The actor's hidden layers."""
    critic_hidden_sizes: tuple[int, ...] = (2048, 2048)
    """Wide critics: batch normalisation lets them train without target networks."""
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    temperature_lr: float = 1e-3
    adam_b1: float = 0.5
    """Adam's first-moment decay for actor and critic (the paper's 0.5; Adam's usual 0.9)."""
    discount: float = 0.99
    batch_size: int = 256
    num_critics: int = 2
    policy_delay: int = 3
    """Critic steps per actor (and temperature) step."""
    init_temperature: float = 1.0
    target_entropy_per_dim: float = -1.0
    batch_norm_momentum: float = 0.99
    """Decay of the running mean and variance (flax's convention: the weight kept on the old value)."""
    batch_norm_epsilon: float = 1e-3
    renorm_warmup_steps: int = 100_000
    """Steps of plain batch normalisation before batch renormalisation's corrections take over."""
    renorm_r_max: float = 3.0
    renorm_d_max: float = 5.0
    actor_batch_norm: bool = True
    """Batch renormalisation in the actor too (the paper's); the numpy runtime runs it as ``batch_norm``."""
    log_std_min: float = -20.0
    log_std_max: float = 2.0
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    """Only ``ignore_fields`` (fields no network reads, as a robot file's reward-only cameras): CrossQ
    here has no image encoder, and ``image_fields`` are refused when the networks are built."""

    def __post_init__(self):
        if self.policy_delay < 1:
            raise ValueError(f"policy_delay must be at least 1, got {self.policy_delay}")
        if not 0.0 <= self.batch_norm_momentum < 1.0:
            raise ValueError(f"batch_norm_momentum must be in [0, 1), got {self.batch_norm_momentum}")
        if self.num_critics < 1:
            raise ValueError(f"num_critics must be at least 1, got {self.num_critics}")
        if self.batch_norm_epsilon <= 0:
            raise ValueError(f"batch_norm_epsilon must be positive, got {self.batch_norm_epsilon}")
