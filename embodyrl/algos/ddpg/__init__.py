"""DDPG (Lillicrap et al., 2016): deterministic actor, Q critic, target networks."""

from ..lazy import exports
from .config import DDPGConfig, td3
from .entries import ENTRIES

# JAX behind these: imported on first use, so the settings and ENTRIES load without it
__getattr__ = exports(__name__, {
    "DDPG": "algorithm",
    "export_ddpg": "export",
    "TrainingState": "learning",
    "act": "learning",
    "init": "learning",
    "initial_state": "learning",
    "make_update": "learning",
    "make_update_many": "learning",
    "DDPGNetworks": "networks",
    "make_networks": "networks",
})

__all__ = ["DDPG", "DDPGConfig", "ENTRIES", "td3", "DDPGNetworks", "TrainingState", "act", "export_ddpg", "init",
           "initial_state", "make_networks", "make_update", "make_update_many"]
