"""SAC's (and RLPD's) actor for the numpy runtime: the MLP, the squashed Gaussian, the action bounds."""

from __future__ import annotations

import numpy as np

from ...hal.steps import NO_POLICY, PolicyVersion
from ..runtime_graph import PolicyHead, bounded_policy
from .config import SACConfig
from .networks import SACNetworks

FAMILY = "sac"
"""The export's ``algo`` for SAC and RLPD alike."""


def head(config: SACConfig) -> PolicyHead:
    """The MLP's output split into the mean and the squashed log std (``gaussian_head``), then tanh."""
    return PolicyHead(FAMILY, ({"op": "gaussian_head", "log_std_min": config.log_std_min,
                                "log_std_max": config.log_std_max, "log_std_bounds": config.log_std_bounds},
                               {"op": "tanh"}),
                      {"kind": "squashed_gaussian"})


def export_sac(networks: SACNetworks, actor_params, config: SACConfig,
               version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of SAC's policy: its mean action, and samples of its squashed Gaussian."""
    return bounded_policy(networks, actor_params, head(config), version)
