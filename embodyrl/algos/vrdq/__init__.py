"""Decentralised Q-learning with consensus on tabular MDPs: VRDQ as its paper states it
(:mod:`.learning`, :mod:`.schedule`) and per-sample consensus Q-learning to compare with
(:mod:`.per_sample`)."""

from . import per_sample
from .graphs import TOPOLOGIES, adjacency, contraction, metropolis, spectral_gap
from .learning import Trace, VRDQConfig, VRDQState, draw, init, make_epoch, refined_operator, run
from .schedule import Schedule

__all__ = ["TOPOLOGIES", "Schedule", "Trace", "VRDQConfig", "VRDQState", "adjacency", "contraction", "draw",
           "init", "make_epoch", "metropolis", "per_sample", "refined_operator", "run", "spectral_gap"]
