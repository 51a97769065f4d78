"""SAC over devices of different shapes: a headed squashed-Gaussian actor and headed critics.

The layout, routing and critics are :mod:`embodyrl.algos.heads`'. Device
``d``'s output head writes ``2 * m_d`` values, its ``m_d`` means then its
``m_d`` raw log stds; :meth:`HeteroSACNetworks.distribution` gathers them
into padded [mean | log std] halves. A row's log-probability sums only its
device's dimensions, its padded action dimensions are exactly zero, and the
entropy target is ``target_entropy_per_dim`` times the row's own action size
(:meth:`~embodyrl.algos.heads.RoutedCritics.action_dims`), so one
temperature serves a batch that mixes a 1-torque pendulum with a 7-joint arm.
SAC's update (:mod:`embodyrl.algos.sac`) runs unchanged on these networks.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..hal.layout import Layout
from ..hal.runtime import bounded_log_std
from .heads import HeadedMLP, RoutedCritics, init, make_critics, padded_rows
from .networks import squashed_gaussian
from .sac import SACConfig

__all__ = ["HeteroSACNetworks", "init", "make_networks"]  # init: heads' serves SAC's configs too


@dataclass(frozen=True, eq=False)
class HeteroSACNetworks(RoutedCritics):
    """SAC's network interface (``distribution``, ``sample``, ``mean_action``, ``q_values``) over routed rows."""

    log_std_min: float = -5.0
    log_std_max: float = 2.0
    log_std_bounds: str = "tanh"

    def _gather(self) -> jax.Array:
        """[devices, 2 * max action]: where each padded [mean | raw] slot reads the device's head output."""
        width = self.action_spec.shape[0]
        table = np.zeros((len(self.layout.kinds), 2 * width), np.int32)
        for d, m in enumerate(self.layout.action_sizes):
            table[d, :m] = np.arange(m)
            table[d, width:width + m] = m + np.arange(m)
        return jnp.asarray(table)

    def distribution(self, actor_params, observation) -> tuple[jax.Array, jax.Array]:
        """(mean, log_std) of the pre-tanh Gaussian, [N, max action]; padded slots are masked by callers."""
        x, device, _ = padded_rows(observation)
        out = nnx.merge(self.actor_graph, actor_params)(x, device)
        mean, raw = jnp.split(jnp.take_along_axis(out, self._gather()[device], axis=-1), 2, axis=-1)
        return mean, bounded_log_std(raw, self.log_std_min, self.log_std_max, self.log_std_bounds, jnp)

    def mean_action(self, actor_params, observation) -> jax.Array:
        _, device, lead = padded_rows(observation)
        mean, _ = self.distribution(actor_params, observation)
        return (jnp.tanh(mean) * self._mask(device)).reshape(*lead, -1)

    def sample(self, actor_params, observation, key) -> tuple[jax.Array, jax.Array]:
        """(padded unit action, log-probability over the row's own dimensions), reparameterised."""
        _, device, lead = padded_rows(observation)
        mean, log_std = self.distribution(actor_params, observation)
        mask = self._mask(device)
        unit, logp = squashed_gaussian(mean, log_std, key)
        return (unit * mask).reshape(*lead, -1), jnp.sum(logp * mask, axis=-1).reshape(lead)


def make_networks(layout: Layout, config: SACConfig, key: jax.Array):
    """(networks, actor_params, critic_params), the critics stacked on a leading axis."""
    if config.actor_layer_norm:
        raise ValueError("sac.actor_layer_norm: the actor over devices of different shapes has no LayerNorm "
                         "(its numpy export is per device); leave it false with tasks joined by +")
    actor_key, *critic_keys = jax.random.split(key, 1 + config.num_critics)
    actor_graph, actor_state = nnx.split(HeadedMLP(layout.observation_sizes, config.hidden_sizes,
                                                   [2 * m for m in layout.action_sizes], rngs=nnx.Rngs(actor_key)))
    critic_graph, critic_params = make_critics(layout, config.hidden_sizes, critic_keys, config.critic_layer_norm)
    networks = HeteroSACNetworks(layout, actor_graph, critic_graph, config.log_std_min, config.log_std_max,
                                  config.log_std_bounds)
    return networks, nnx.to_pure_dict(actor_state), critic_params
