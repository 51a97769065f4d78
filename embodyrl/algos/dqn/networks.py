"""The Q-network: an MLP from the flattened observation to one value per discrete action."""

from __future__ import annotations

from dataclasses import dataclass

import jax
from flax import nnx

from ...hal.specs import ArraySpec, DictSpec
from ..networks import MLP, flatten_observation, observation_size


@dataclass(frozen=True, eq=False)
class QNetworks:
    observation_spec: DictSpec
    action_spec: ArraySpec
    graph: nnx.GraphDef
    num_actions: int

    def q_values(self, params, observation) -> jax.Array:
        """Q(o, .) with shape [..., num_actions]."""
        return nnx.merge(self.graph, params)(flatten_observation(observation, self.observation_spec))


def make_networks(observation_spec: DictSpec, action_spec: ArraySpec, hidden_sizes, key: jax.Array):
    """(networks, parameters); the action must be a bounded integer scalar in [0, n-1]."""
    if action_spec.dtype.kind not in "iu" or action_spec.shape != () or not action_spec.bounded:
        raise ValueError(f"{action_spec.name}: DQN needs a bounded integer scalar action, got "
                         f"{action_spec.dtype}{action_spec.shape}")
    if int(action_spec.minimum) != 0:
        raise ValueError(f"{action_spec.name}: DQN's actions are 0..n-1, got minimum {action_spec.minimum}")
    num_actions = int(action_spec.maximum) + 1
    graph, state = nnx.split(MLP(observation_size(observation_spec), hidden_sizes, num_actions,
                                 rngs=nnx.Rngs(key)))
    return QNetworks(observation_spec, action_spec, graph, num_actions), nnx.to_pure_dict(state)
