"""DDPG (Lillicrap et al., 2016): deterministic actor, Q critic, target networks."""

from .algorithm import DDPG, ENTRIES
from .config import DDPGConfig, td3
from .export import export_ddpg
from .learning import TrainingState, act, init, initial_state, make_update, make_update_many
from .networks import DDPGNetworks, make_networks

__all__ = ["DDPG", "DDPGConfig", "ENTRIES", "td3", "DDPGNetworks", "TrainingState", "act", "export_ddpg", "init",
           "initial_state", "make_networks", "make_update", "make_update_many"]
