"""SAC's squashed-Gaussian actor and its critic ensemble (stacked on a leading axis)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from ...hal.runtime import bounded_log_std
from ...hal.specs import ArraySpec, DictSpec
from ..encoders import ObservationEncoder, features, make_encoder, network_inputs
from ..networks import MLP, ActionScale, observation_size, squashed_gaussian
from .config import SECTION


@dataclass(frozen=True, eq=False)
class SACNetworks:
    observation_spec: DictSpec
    action_spec: ArraySpec
    actor_graph: nnx.GraphDef
    critic_graph: nnx.GraphDef
    scale: ActionScale
    log_std_min: float
    log_std_max: float
    log_std_bounds: str = "tanh"
    encoder: ObservationEncoder | None = None
    inputs: DictSpec | None = None
    """The fields the networks read (:func:`~embodyrl.algos.encoders.network_inputs`); None: every field."""

    def __post_init__(self):
        if self.inputs is None:
            object.__setattr__(self, "inputs", self.observation_spec)

    def distribution(self, actor_params, observation) -> tuple[jax.Array, jax.Array]:
        """(mean, log_std) of the pre-tanh Gaussian."""
        x, body = features(self.encoder, self.inputs, actor_params, observation, "policy")
        out = nnx.merge(self.actor_graph, body)(x)
        mean, raw = jnp.split(out, 2, axis=-1)
        return mean, bounded_log_std(raw, self.log_std_min, self.log_std_max, self.log_std_bounds, jnp)

    def mean_action(self, actor_params, observation) -> jax.Array:
        """The deterministic action tanh(mean), in the action bounds (what evaluation runs)."""
        mean, _ = self.distribution(actor_params, observation)
        return self.scale.to_env(jnp.tanh(mean))

    def sample(self, actor_params, observation, key) -> tuple[jax.Array, jax.Array]:
        """(action in bounds, log-probability of the unit-range action), reparameterised."""
        unit, logp = squashed_gaussian(*self.distribution(actor_params, observation), key)
        return self.scale.to_env(unit), jnp.sum(logp, axis=-1)

    def action_dims(self, observation) -> int:
        """Action dimensions per row (one device kind: the action's size), for the entropy target."""
        return self.action_spec.size

    def q_values(self, critic_params, observation, action) -> jax.Array:
        """Every critic's Q(o, a): [critics, batch...]."""
        x, ensemble = features(self.encoder, self.inputs, critic_params, observation, "ensemble")
        a = self.scale.to_unit(action)
        xa = jnp.concatenate([x, a], axis=-1)
        return jax.vmap(lambda p: nnx.merge(self.critic_graph, p)(xa)[..., 0])(ensemble)


def make_networks(observation_spec: DictSpec, action_spec: ArraySpec, config, key: jax.Array):
    """(networks, actor_params, critic_params); with camera images the parameters are
    ``{"encoder", "policy"}`` and ``{"encoder", "ensemble"}`` (see the DDPG networks). The networks
    read every field but ``config.encoder.ignore_fields``."""
    inputs = network_inputs(observation_spec, config.encoder, f"{SECTION}.encoder")
    # the encoder's key is folded off, so networks without images draw what they always drew
    encoder, encoder_params = make_encoder(observation_spec, config.encoder, jax.random.fold_in(key, 7),
                                           f"{SECTION}.encoder")
    obs_size = encoder.size if encoder is not None else observation_size(inputs)
    act_size = action_spec.size
    actor_key, *critic_keys = jax.random.split(key, 1 + config.num_critics)
    actor_graph, actor_state = nnx.split(MLP(obs_size, config.hidden_sizes, 2 * act_size, rngs=nnx.Rngs(actor_key),
                                             layer_norm=config.actor_layer_norm))
    critics = [nnx.split(MLP(obs_size + act_size, config.hidden_sizes, 1, rngs=nnx.Rngs(k),
                             layer_norm=config.critic_layer_norm)) for k in critic_keys]
    critic_params = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.to_pure_dict(s) for _, s in critics])
    networks = SACNetworks(observation_spec, action_spec, actor_graph, critics[0][0], ActionScale(action_spec),
                           config.log_std_min, config.log_std_max, config.log_std_bounds, encoder, inputs)
    actor_params = nnx.to_pure_dict(actor_state)
    if encoder is not None:
        actor_params = {"encoder": jax.tree.map(jnp.copy, encoder_params), "policy": actor_params}
        critic_params = {"encoder": encoder_params, "ensemble": critic_params}
    return networks, actor_params, critic_params
