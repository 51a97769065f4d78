"""SAC (Haarnoja et al. 2018) with RLPD's options (Ball et al. 2023)."""

from .config import SACConfig, rlpd
from .learning import TrainingState, act, init, make_update, make_update_many
from .networks import SACNetworks, make_networks

__all__ = ["SACConfig", "SACNetworks", "TrainingState", "act", "init", "make_networks", "make_update",
           "make_update_many", "rlpd"]
