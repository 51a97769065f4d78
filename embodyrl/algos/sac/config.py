from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...hal.runtime import LOG_STD_BOUNDS
from ..encoder_config import EncoderConfig

SECTION = "sac"
"""The TrainConfig section holding these settings (for both of the package's registry names)."""


@dataclass(frozen=True)
class SACConfig:
    hidden_sizes: tuple[int, ...] = (256, 256)
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    temperature_lr: float = 3e-4
    discount: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    num_critics: int = 2
    """Critics in the ensemble (SAC: 2; RLPD: 10)."""
    num_min_critics: int = 2
    """The target takes the minimum over this many critics drawn at random each step (RLPD's subset)."""
    critic_layer_norm: bool = False
    """LayerNorm in the critics (RLPD): keeps Q bounded at high update-to-data ratios."""
    actor_layer_norm: bool = False
    """LayerNorm before each ReLU of the actor too (SERL's and HIL-SERL's networks): an input far from
    unit scale (a gripper command in 0..255, joint velocities) then cannot saturate the squashed
    Gaussian, whose entropy a saturated tanh drives far below the target while the temperature grows."""
    actor_q: str = "min"
    """How the actor reads the ensemble: min (SAC) or mean (RLPD)."""
    init_temperature: float = 1.0
    target_entropy_per_dim: float = -1.0
    """Target entropy per action dimension for automatic tuning (SAC: -1; RLPD: -1/2)."""
    backup_entropy: bool = True
    """Subtract alpha * log pi(a'|o') in the TD target (RLPD turns it off)."""
    log_std_min: float = -5.0
    log_std_max: float = 2.0
    log_std_bounds: str = "tanh"
    """How the actor's raw log std is held in [log_std_min, log_std_max]: ``tanh`` rescales a tanh
    into the range (CleanRL; a fresh actor's std is exp((min + max) / 2), 0.22); ``clip`` clips it
    (SAC's own code, SB3, SBX; with min -20 a fresh actor's std is about 1). docs/benchmarks.md
    has what each measured on HalfCheetah and the pendulum."""
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    """The convolutional encoder used when the observation has camera images (DrQ)."""

    def __post_init__(self):
        if not 1 <= self.num_min_critics <= self.num_critics:
            raise ValueError("num_min_critics must be between 1 and num_critics")
        if self.log_std_bounds not in LOG_STD_BOUNDS:
            raise ValueError(f"log_std_bounds must be one of {LOG_STD_BOUNDS}, got {self.log_std_bounds!r}")
        if self.actor_q not in ("min", "mean"):
            raise ValueError(f"actor_q must be 'min' or 'mean', got {self.actor_q!r}")


def rlpd(config: SACConfig = SACConfig()) -> SACConfig:
    """SAC with RLPD's options. Pair it with a high update-to-data ratio
    (``learner.updates_per_step`` = 20) and symmetric sampling of demonstrations
    and online data (50/50 per-source mixing in the replay)."""
    return replace(config, num_critics=10, num_min_critics=2, critic_layer_norm=True, actor_q="mean",
                   target_entropy_per_dim=-0.5, backup_entropy=False)
