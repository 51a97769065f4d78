"""PPO's policy (Gaussian for continuous actions, categorical for discrete) and value networks.

The Gaussian's mean is tanh of the MLP's output, in half action ranges: it
stays within the bounds while samples may fall outside (the safety layer
clips them; the log-probability is of the sample). An unbounded mean can
drift past a bound, where every sample clips to the same action and the
gradient no longer says anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from ...hal.specs import ArraySpec, DictSpec
from ..networks import MLP, ActionScale, flatten_observation, observation_size


@dataclass(frozen=True, eq=False)
class PPONetworks:
    observation_spec: DictSpec
    action_spec: ArraySpec
    policy_graph: nnx.GraphDef
    value_graph: nnx.GraphDef
    discrete: bool
    num_actions: int
    scale: ActionScale | None

    def _features(self, observation):
        return flatten_observation(observation, self.observation_spec)

    def value(self, params, observation) -> jax.Array:
        return nnx.merge(self.value_graph, params["value"])(self._features(observation))[..., 0]

    def _head(self, params, observation):
        """Logits (discrete), or the Gaussian's mean in half action ranges, in [-1, 1]."""
        out = nnx.merge(self.policy_graph, params["policy"])(self._features(observation))
        return out if self.discrete else jnp.tanh(out)

    def log_prob(self, params, observation, action) -> jax.Array:
        """log pi(a|o) of an action in the environment's units (or an integer action)."""
        out = self._head(params, observation)
        if self.discrete:
            logp = jax.nn.log_softmax(out)
            return jnp.take_along_axis(logp, action.astype(jnp.int32).reshape(*logp.shape[:-1], 1), -1)[..., 0]
        unit = self.scale.to_unit(action)
        log_std = params["log_std"]
        z = (unit - out) / jnp.exp(log_std)
        return jnp.sum(-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), -1) - jnp.sum(jnp.log(self.scale.half_range))

    def entropy(self, params, observation) -> jax.Array:
        out = self._head(params, observation)
        if self.discrete:
            logp = jax.nn.log_softmax(out)
            return -jnp.sum(jnp.exp(logp) * logp, -1)
        per_dim = 0.5 + 0.5 * jnp.log(2 * jnp.pi) + params["log_std"]
        return jnp.broadcast_to(jnp.sum(per_dim), out.shape[:-1])

    def sample(self, params, observation, key) -> jax.Array:
        """An action from pi(.|o): an integer, or a Gaussian sample in env units (not clipped:
        the device's safety layer clips; the log-probability is of the sample)."""
        out = self._head(params, observation)
        if self.discrete:
            return jax.random.categorical(key, out)
        unit = out + jnp.exp(params["log_std"]) * jax.random.normal(key, out.shape)
        return self.scale.to_env(unit)

    def mode(self, params, observation) -> jax.Array:
        out = self._head(params, observation)
        return jnp.argmax(out, -1) if self.discrete else self.scale.to_env(out)


def make_networks(observation_spec: DictSpec, action_spec: ArraySpec, config, key: jax.Array):
    """Discrete when the action spec is a scalar integer in [0, n-1]; else continuous."""
    discrete = action_spec.dtype.kind in "iu"
    if discrete:
        if action_spec.shape != () or not action_spec.bounded:
            raise ValueError("discrete actions: a bounded integer scalar spec [0, n-1]")
        num_actions = int(action_spec.maximum) - int(action_spec.minimum) + 1
        out, scale = num_actions, None
    else:
        num_actions, out, scale = 0, action_spec.size, ActionScale(action_spec)
    k1, k2 = jax.random.split(key)
    obs = observation_size(observation_spec)
    policy_graph, policy_state = nnx.split(MLP(obs, config.hidden_sizes, out, rngs=nnx.Rngs(k1)))
    value_graph, value_state = nnx.split(MLP(obs, config.hidden_sizes, 1, rngs=nnx.Rngs(k2)))
    params = {"policy": nnx.to_pure_dict(policy_state), "value": nnx.to_pure_dict(value_state)}
    if not discrete:
        params["log_std"] = jnp.full((out,), config.init_log_std, jnp.float32)
    networks = PPONetworks(observation_spec, action_spec, policy_graph, value_graph, discrete, num_actions, scale)
    return networks, params


