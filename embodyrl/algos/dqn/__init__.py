"""Double DQN with n-step returns for discrete actions, and its distributed form: several
learners, each with its own actors and replay, reaching consensus on parameters over peer links."""

from .algorithm import DQN, ENTRIES
from .config import DQNConfig
from .export import export_dqn
from .learning import TrainingState, act, init, make_update_many
from .losses import double_q_targets, double_q_targets_loop, n_step_return, td_loss
from .networks import QNetworks, make_networks

__all__ = ["DQN", "DQNConfig", "ENTRIES", "QNetworks", "TrainingState", "act", "double_q_targets",
           "double_q_targets_loop", "export_dqn", "init", "make_networks", "make_update_many", "n_step_return",
           "td_loss"]
