"""PPO's policy for the numpy runtime: a Gaussian around the MLP's tanh mean, or a categorical."""

from __future__ import annotations

import numpy as np

from ...hal.steps import NO_POLICY, PolicyVersion
from ..runtime_graph import SCALE, concat, finish, mlp_ops, published, scale_arrays
from .networks import PPONetworks


def export_ppo(networks: PPONetworks, actor_params,
               version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of PPO's policy (:mod:`embodyrl.algos.ppo`): the MLP's tanh mean plus noise of its
    learned ``log_std`` then the action scale (Gaussian), or its logits sampled or maxed (categorical).
    ``actor_params`` as published: ``{"policy": ..., "log_std": ...}``; the runtime returns the
    sample's log-probability, so a numpy actor can feed asynchronous PPO."""
    graph = [concat(networks.observation_spec),
             *mlp_ops(networks.policy_graph, actor_params["policy"], "actor/policy", "policy")]
    arrays = published(actor_params)
    if networks.discrete:
        graph.append({"op": "categorical"})
    else:
        graph += [{"op": "tanh"}, {"op": "gaussian_noise", "log_std": "actor/log_std"}, SCALE]
        arrays.update(scale_arrays(networks.scale))
    return finish("ppo", version, networks.observation_spec, networks.action_spec, {"kind": "sampled"},
                  graph, arrays)
