"""SAC (Haarnoja et al. 2018) with RLPD's options (Ball et al. 2023)."""

from .algorithm import ENTRIES, SAC
from .config import SACConfig, rlpd
from .export import export_sac
from .learning import TrainingState, act, init, initial_state, make_update, make_update_many
from .networks import SACNetworks, make_networks

__all__ = ["ENTRIES", "SAC", "SACConfig", "SACNetworks", "TrainingState", "act", "export_sac", "init",
           "initial_state", "make_networks", "make_update", "make_update_many", "rlpd"]
