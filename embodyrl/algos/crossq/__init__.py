"""CrossQ (Bhatt et al. 2024): SAC with batch-renormalised critics and no target networks."""

from ..lazy import exports
from .config import CrossQConfig
from .entries import ENTRIES

# JAX behind these: imported on first use, so the settings and ENTRIES load without it
__getattr__ = exports(__name__, {
    "CrossQ": "algorithm",
    "export_crossq": "export",
    "TrainingState": "learning",
    "act": "learning",
    "init": "learning",
    "make_update": "learning",
    "make_update_many": "learning",
    "CrossQNetworks": "networks",
    "make_networks": "networks",
})

__all__ = ["ENTRIES", "CrossQ", "CrossQConfig", "CrossQNetworks", "TrainingState", "act", "export_crossq", "init",
           "make_networks", "make_update", "make_update_many"]
