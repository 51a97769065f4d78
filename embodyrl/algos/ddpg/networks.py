"""DDPG's actor mu(o) and its critics Q_i(o, a), as MLPs over the observation's features.

The critics are an ensemble whose parameters are stacked on a leading axis
(one critic for DDPG, two for TD3) and evaluated with ``vmap``. Features are
the flattened fields read (every field but ``encoder.ignore_fields``), or,
when they include camera images, the output of a
convolutional encoder (:mod:`embodyrl.algos.encoders`): then the parameters
are ``{"encoder", "policy"}`` for the actor and ``{"encoder", "ensemble"}``
for the critics, the critic's encoder being the one trained.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from ...hal.specs import ArraySpec, DictSpec
from ..encoders import EncoderConfig, ObservationEncoder, features, make_encoder, network_inputs
from ..networks import MLP, ActionScale, observation_size
from .config import SECTION


@dataclass(frozen=True, eq=False)
class DDPGNetworks:
    """Static structure (graph definitions, specs); parameters live in the state."""

    observation_spec: DictSpec
    action_spec: ArraySpec
    actor_graph: nnx.GraphDef
    critic_graph: nnx.GraphDef
    scale: ActionScale
    encoder: ObservationEncoder | None = None
    inputs: DictSpec | None = None
    """The fields the networks read (:func:`~embodyrl.algos.encoders.network_inputs`); None: every field."""

    def __post_init__(self):
        if self.inputs is None:
            object.__setattr__(self, "inputs", self.observation_spec)

    def policy(self, actor_params, observation) -> jax.Array:
        """The deterministic action mu(o), within the action bounds."""
        x, body = features(self.encoder, self.inputs, actor_params, observation, "policy")
        unit = jnp.tanh(nnx.merge(self.actor_graph, body)(x))
        return self.scale.to_env(unit)

    def q_values(self, critic_params, observation, action) -> jax.Array:
        """Every critic's Q(o, a): shape [critics, batch...]."""
        x, ensemble = features(self.encoder, self.inputs, critic_params, observation, "ensemble")
        a = self.scale.to_unit(action.reshape(*action.shape[: action.ndim - 1], -1))
        xa = jnp.concatenate([x, a], axis=-1)
        return jax.vmap(lambda p: nnx.merge(self.critic_graph, p)(xa)[..., 0])(ensemble)


def make_networks(observation_spec: DictSpec, action_spec: ArraySpec,
                  hidden_sizes: tuple[int, ...], key: jax.Array, num_critics: int = 1,
                  encoder_config: EncoderConfig | None = None):
    """(networks, actor_params, critic_params) with freshly initialised parameters."""
    encoder_config = encoder_config or EncoderConfig()
    inputs = network_inputs(observation_spec, encoder_config, f"{SECTION}.encoder")
    # the encoder's key is folded off, so networks without images draw what they always drew
    encoder, encoder_params = make_encoder(observation_spec, encoder_config, jax.random.fold_in(key, 7),
                                           f"{SECTION}.encoder")
    obs_size = encoder.size if encoder is not None else observation_size(inputs)
    act_size = action_spec.size
    actor_key, *critic_keys = jax.random.split(key, 1 + num_critics)
    actor_graph, actor_state = nnx.split(MLP(obs_size, hidden_sizes, act_size, rngs=nnx.Rngs(actor_key)))
    critics = [nnx.split(MLP(obs_size + act_size, hidden_sizes, 1, rngs=nnx.Rngs(k))) for k in critic_keys]
    critic_graph = critics[0][0]
    critic_params = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.to_pure_dict(s) for _, s in critics])
    actor_params = nnx.to_pure_dict(actor_state)
    networks = DDPGNetworks(observation_spec, action_spec, actor_graph, critic_graph, ActionScale(action_spec),
                            encoder, inputs)
    if encoder is not None:
        actor_params = {"encoder": jax.tree.map(jnp.copy, encoder_params), "policy": actor_params}
        critic_params = {"encoder": encoder_params, "ensemble": critic_params}
    return networks, actor_params, critic_params
