"""DDPG's actor mu(o) and its critics Q_i(o, a), as MLPs over the flattened observation.

The critics are an ensemble whose parameters are stacked on a leading axis
(one critic for DDPG, two for TD3) and evaluated with ``vmap``.
"""

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

    def q_values(self, critic_params, observation, action) -> jax.Array:
        """Every critic's Q(o, a): shape [critics, batch...]."""
        x = flatten_observation(observation, self.observation_spec)
        a = self.scale.to_unit(action.reshape(*action.shape[: action.ndim - 1], -1))
        xa = jnp.concatenate([x, a], axis=-1)
        return jax.vmap(lambda p: nnx.merge(self.critic_graph, p)(xa)[..., 0])(critic_params)

    def q_value(self, critic_params, observation, action) -> jax.Array:
        """The first critic's Q(o, a) (the one the actor ascends)."""
        return self.q_values(critic_params, observation, action)[0]


def make_networks(observation_spec: DictSpec, action_spec: ArraySpec,
                  hidden_sizes: tuple[int, ...], key: jax.Array, num_critics: int = 1):
    """(networks, actor_params, critic_params) with freshly initialised parameters."""
    obs_size, act_size = observation_size(observation_spec), action_spec.size
    actor_key, *critic_keys = jax.random.split(key, 1 + num_critics)
    actor_graph, actor_state = nnx.split(MLP(obs_size, hidden_sizes, act_size, rngs=nnx.Rngs(actor_key)))
    critics = [nnx.split(MLP(obs_size + act_size, hidden_sizes, 1, rngs=nnx.Rngs(k))) for k in critic_keys]
    critic_graph = critics[0][0]
    critic_params = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.to_pure_dict(s) for _, s in critics])
    networks = DDPGNetworks(observation_spec, action_spec, actor_graph, critic_graph, ActionScale(action_spec))
    return networks, nnx.to_pure_dict(actor_state), critic_params
