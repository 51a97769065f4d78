"""CrossQ's actor for the numpy runtime: the fields, each norm as ``batch_norm`` with its running
moments, the dense layers, the squashed Gaussian and the action bounds."""

from __future__ import annotations

import numpy as np

from ...hal.steps import NO_POLICY, PolicyVersion
from ..runtime_graph import PolicyHead, bounded_graph, concat, published
from .networks import CrossQNetworks

FAMILY = "crossq"


def head(networks: CrossQNetworks) -> PolicyHead:
    """The MLP's output split into the mean and the clipped log std, then tanh."""
    return PolicyHead(FAMILY, ({"op": "gaussian_head", "log_std_min": networks.log_std_min,
                                "log_std_max": networks.log_std_max, "log_std_bounds": "clip"},
                               {"op": "tanh"}),
                      {"kind": "squashed_gaussian"})


def export_crossq(networks: CrossQNetworks, actor: dict,
                  version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of an :func:`~.networks.acting` actor: its mean action, and samples of its policy."""
    graph = [concat(networks.inputs)]  # an ignored field is sent and never read
    layers = len(actor["layers"])
    for i in range(layers):
        if i in actor["norms"]:
            graph.append({"op": "batch_norm", "epsilon": networks.norm.epsilon,
                          **{role: f"actor/norms/{i}/{role}" for role in ("mean", "var", "scale", "bias")}})
        graph.append({"op": "dense", "kernel": f"actor/layers/{i}/kernel", "bias": f"actor/layers/{i}/bias"})
        if i < layers - 1:
            graph.append({"op": "relu"})
    return bounded_graph(head(networks), graph, networks.scale, published(actor), version,
                         networks.observation_spec, networks.action_spec)
