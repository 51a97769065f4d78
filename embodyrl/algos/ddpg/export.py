"""DDPG's (and TD3's) actor for the numpy runtime: the MLP, tanh, the action bounds, Gaussian exploration."""

from __future__ import annotations

import numpy as np

from ...hal.steps import NO_POLICY, PolicyVersion
from ..runtime_graph import PolicyHead, bounded_policy
from .config import DDPGConfig
from .networks import DDPGNetworks

FAMILY = "ddpg"
"""The export's ``algo`` for DDPG and TD3 alike: the numpy runtime runs both the same way."""


def head(config: DDPGConfig) -> PolicyHead:
    """tanh after the MLP; exploring, Gaussian noise of ``exploration_noise`` half ranges."""
    return PolicyHead(FAMILY, ({"op": "tanh"},), {"kind": "gaussian", "std": float(config.exploration_noise)})


def export_ddpg(networks: DDPGNetworks, actor_params, config: DDPGConfig,
                version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of DDPG's deterministic policy plus its Gaussian exploration."""
    return bounded_policy(networks, actor_params, head(config), version)
