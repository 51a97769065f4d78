"""DQN's greedy policy for the numpy runtime: the Q-network's MLP, then the best action."""

from __future__ import annotations

import numpy as np

from ...hal.steps import NO_POLICY, PolicyVersion
from ..runtime_graph import concat, finish, mlp_ops, published
from .networks import QNetworks


def export_dqn(networks: QNetworks, params, epsilon: float = 0.0,
               version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of a DQN's greedy policy (:mod:`embodyrl.algos.dqn`): the Q-network's MLP, then
    the best action; exploring, a uniform action with probability ``epsilon``."""
    graph = [concat(networks.observation_spec), *mlp_ops(networks.graph, params, "actor", "Q-network"),
             {"op": "argmax"}]
    return finish("dqn", version, networks.observation_spec, networks.action_spec,
                  {"kind": "epsilon_greedy", "epsilon": float(epsilon)}, graph, published(params))
