"""Decentralised Q-learning with consensus (VRDQ) on tabular MDPs."""

from .graphs import TOPOLOGIES, adjacency, metropolis, spectral_gap
from .learning import (
           VRDQConfig,
           VRDQState,
           empirical_operator,
           init,
           make_epoch,
           messages_per_epoch,
           mix,
           run,
)

__all__ = ["TOPOLOGIES", "VRDQConfig", "VRDQState", "adjacency", "empirical_operator", "init", "make_epoch",
           "messages_per_epoch", "metropolis", "mix", "run", "spectral_gap"]
