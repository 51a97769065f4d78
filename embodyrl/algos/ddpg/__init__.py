"""DDPG (Lillicrap et al., 2016): deterministic actor, Q critic, target networks."""

from .config import DDPGConfig, td3
from .learning import TrainingState, act, init, make_update, make_update_many
from .networks import DDPGNetworks, make_networks

__all__ = ["DDPGConfig", "td3", "DDPGNetworks", "TrainingState", "act", "init", "make_networks",
           "make_update", "make_update_many"]
