"""DDPG's actor mu(o) and critic Q(o, a), as MLPs over the flattened observation."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from ...hal.specs import ArraySpec, DictSpec
from ..networks import MLP, ActionScale, flatten_observation, observation_size


@dataclass(frozen=True, eq=False)
class DDPGNetworks:
    """Static structure (graph definitions, specs); parameters live in the state."""

    observation_spec: DictSpec
    action_spec: ArraySpec
    actor_graph: nnx.GraphDef
    critic_graph: nnx.GraphDef
    scale: ActionScale

    def policy(self, actor_params, observation) -> jax.Array:
        """The deterministic action mu(o), within the action bounds."""
        x = flatten_observation(observation, self.observation_spec)
        unit = jnp.tanh(nnx.merge(self.actor_graph, actor_params)(x))
        return self.scale.to_env(unit)

    def q_value(self, critic_params, observation, action) -> jax.Array:
        x = flatten_observation(observation, self.observation_spec)
        a = self.scale.to_unit(action.reshape(*action.shape[: action.ndim - 1], -1))
        q = nnx.merge(self.critic_graph, critic_params)(jnp.concatenate([x, a], axis=-1))
        return q[..., 0]


def make_networks(observation_spec: DictSpec, action_spec: ArraySpec,
                  hidden_sizes: tuple[int, ...], key: jax.Array):
    """(networks, actor_params, critic_params) with freshly initialised parameters."""
    obs_size, act_size = observation_size(observation_spec), action_spec.size
    actor_key, critic_key = jax.random.split(key)
    actor = MLP(obs_size, hidden_sizes, act_size, rngs=nnx.Rngs(actor_key))
    critic = MLP(obs_size + act_size, hidden_sizes, 1, rngs=nnx.Rngs(critic_key))
    actor_graph, actor_state = nnx.split(actor)
    critic_graph, critic_state = nnx.split(critic)
    networks = DDPGNetworks(observation_spec, action_spec, actor_graph, critic_graph,
                            ActionScale(action_spec))
    return networks, nnx.to_pure_dict(actor_state), nnx.to_pure_dict(critic_state)
