"""SAC (Haarnoja et al. 2018) with RLPD's options (Ball et al. 2023)."""

from ..lazy import exports
from .config import SACConfig, rlpd
from .entries import ENTRIES

# JAX behind these: imported on first use, so the settings and ENTRIES load without it
__getattr__ = exports(__name__, {
    "SAC": "algorithm",
    "export_sac": "export",
    "TrainingState": "learning",
    "act": "learning",
    "init": "learning",
    "initial_state": "learning",
    "make_update": "learning",
    "make_update_many": "learning",
    "SACNetworks": "networks",
    "make_networks": "networks",
})

__all__ = ["ENTRIES", "SAC", "SACConfig", "SACNetworks", "TrainingState", "act", "export_sac", "init",
           "initial_state", "make_networks", "make_update", "make_update_many", "rlpd"]
