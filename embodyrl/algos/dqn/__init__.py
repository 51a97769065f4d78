"""Double DQN with n-step returns for discrete actions, and its distributed form: several
learners, each with its own actors and replay, reaching consensus on parameters over peer links."""

from ..lazy import exports
from .config import DQNConfig
from .entries import ENTRIES

# JAX behind these: imported on first use, so the settings and ENTRIES load without it
__getattr__ = exports(__name__, {
    "DQN": "algorithm",
    "export_dqn": "export",
    "TrainingState": "learning",
    "act": "learning",
    "init": "learning",
    "make_update_many": "learning",
    "double_q_targets": "losses",
    "double_q_targets_loop": "losses",
    "n_step_return": "losses",
    "td_loss": "losses",
    "QNetworks": "networks",
    "make_networks": "networks",
})

__all__ = ["DQN", "DQNConfig", "ENTRIES", "QNetworks", "TrainingState", "act", "double_q_targets",
           "double_q_targets_loop", "export_dqn", "init", "make_networks", "make_update_many", "n_step_return",
           "td_loss"]
