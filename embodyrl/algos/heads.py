"""One policy for devices of different shapes: per-device input and output heads around a shared trunk.

A run over several device kinds stores their rows padded into one layout
and routed by device id (:class:`embodyrl.hal.layout.Layout`), so the replay,
the sampler, n-step returns and the jitted scan stay as they are, and a
batch mixes devices. The networks here run every input head on every row and
keep, per row, the head of its device (``jnp.take_along_axis``); rows of
device A thus send no gradient to device B's heads, while the trunk learns
from all. Output heads write the device's action dimensions; padded
dimensions are zero and no critic reads them. DDPG/TD3's update
(:mod:`embodyrl.algos.ddpg`) runs unchanged on these networks, and SAC and
RLPD on the same heads (:mod:`embodyrl.algos.heads_sac`).

:func:`over` is the one place that chooses: an algorithm over a one-kind
layout is the algorithm itself (its own networks, on the device's own
specs); over several kinds it is :class:`Headed`. Actors act through
:class:`embodyrl.policy.JaxPolicy`, which pads and unpads through the layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ..hal.layout import DEVICE, FEATURES, Layout
from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import NO_POLICY, PolicyVersion
from .networks import ActionScale
from .runtime_graph import device_policy


class HeadedMLP(nnx.Module):
    """Per-device input layer -> shared trunk (ReLU MLP) -> per-device output layer, routed per row.

    ``layer_norm``: a shared LayerNorm before each ReLU (RLPD's critics), as in :class:`~.networks.MLP`.
    """

    def __init__(self, in_sizes: Sequence[int], hidden_sizes: Sequence[int], out_sizes: Sequence[int],
                 *, rngs: nnx.Rngs, layer_norm: bool = False):
        first, *trunk = hidden_sizes
        self.inputs = nnx.List([nnx.Linear(n, first, rngs=rngs) for n in in_sizes])
        sizes = [first, *trunk]
        self.trunk = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:], strict=True)])
        self.outputs = nnx.List([nnx.Linear(sizes[-1], n, rngs=rngs) for n in out_sizes])
        self.norms = nnx.List([nnx.LayerNorm(h, rngs=rngs) for h in hidden_sizes]) if layer_norm else None
        self.in_sizes, self.out_sizes = tuple(in_sizes), tuple(out_sizes)

    def _activate(self, i: int, h: jax.Array) -> jax.Array:
        return jax.nn.relu(h if self.norms is None else self.norms[i](h))

    def __call__(self, x: jax.Array, device: jax.Array) -> jax.Array:
        """``x`` [B, max in] (each row's device reads its first ``in_sizes[d]`` values) -> [B, max out]."""
        route = device.astype(jnp.int32)[None, :, None]
        h = jnp.stack([head(x[..., :n]) for head, n in zip(self.inputs, self.in_sizes, strict=True)])
        h = self._activate(0, jnp.take_along_axis(h, route, axis=0)[0])
        for i, layer in enumerate(self.trunk):
            h = self._activate(i + 1, layer(h))
        width = max(self.out_sizes)
        outs = jnp.stack([jnp.pad(head(h), ((0, 0), (0, width - n)))
                          for head, n in zip(self.outputs, self.out_sizes, strict=True)])
        return jnp.take_along_axis(outs, route, axis=0)[0]


@dataclass(frozen=True, eq=False)
class RoutedCritics:
    """What DDPG's and SAC's headed networks share: the padded specs, the action mask, the critics."""

    layout: Layout
    actor_graph: nnx.GraphDef
    critic_graph: nnx.GraphDef

    encoder = None  # state observations only

    @property
    def scale(self) -> ActionScale:
        """The padded unit action's scale: the identity (each device's own bounds apply at its actor)."""
        return ActionScale(self.action_spec)

    @property
    def observation_spec(self) -> DictSpec:
        return self.layout.observation_spec

    @property
    def action_spec(self) -> ArraySpec:
        return self.layout.action_spec

    def _mask(self, device: jax.Array) -> jax.Array:
        """1 on each row's own action dimensions, 0 on the padding."""
        sizes = jnp.asarray(self.layout.action_sizes)[device]
        return (jnp.arange(self.action_spec.shape[0]) < sizes[..., None]).astype(jnp.float32)

    def action_dims(self, observation) -> jax.Array:
        """Each row's device's action size (SAC's entropy target is per dimension)."""
        return jnp.asarray(self.layout.action_sizes)[padded_rows(observation)[1]]

    def q_values(self, critic_params, observation, action) -> jax.Array:
        """Every critic's Q: [critics, batch...]; a device's critic head reads [its obs, its action]."""
        x, device, lead = padded_rows(observation)
        a = action.reshape(-1, action.shape[-1])
        width = max(n + m for n, m in zip(self.layout.observation_sizes, self.layout.action_sizes, strict=True))
        xa = jnp.stack([jnp.pad(jnp.concatenate([x[:, :n], a[:, :m]], -1), ((0, 0), (0, width - n - m)))
                        for n, m in zip(self.layout.observation_sizes, self.layout.action_sizes, strict=True)])
        xa = jnp.take_along_axis(xa, device[None, :, None], axis=0)[0]

        def one(params):
            return nnx.merge(self.critic_graph, params)(xa, device)[..., 0]

        return jax.vmap(one)(critic_params).reshape(-1, *lead)


@dataclass(frozen=True, eq=False)
class HeteroNetworks(RoutedCritics):
    """DDPG's network interface (``policy``, ``q_values``, ``scale``) over padded, routed rows."""

    def policy(self, actor_params, observation) -> jax.Array:
        x, device, lead = padded_rows(observation)
        unit = jnp.tanh(nnx.merge(self.actor_graph, actor_params)(x, device))
        return (unit * self._mask(device)).reshape(*lead, -1)


def padded_rows(observation):
    """(features [N, width], device ids [N], the leading shape) of a possibly batched padded observation."""
    x = jnp.asarray(observation[FEATURES], jnp.float32)
    lead = x.shape[:-1]
    return x.reshape(-1, x.shape[-1]), jnp.asarray(observation[DEVICE], jnp.int32).reshape(-1), lead


def make_critics(layout: Layout, hidden_sizes: tuple[int, ...], keys, layer_norm: bool = False):
    """(graph, parameters stacked on a leading axis) of one headed critic per key."""
    critic_in = [n + m for n, m in zip(layout.observation_sizes, layout.action_sizes, strict=True)]
    critics = [nnx.split(HeadedMLP(critic_in, hidden_sizes, [1] * len(critic_in), rngs=nnx.Rngs(k),
                                   layer_norm=layer_norm)) for k in keys]
    return critics[0][0], jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.to_pure_dict(s) for _, s in critics])


def make_networks(layout: Layout, hidden_sizes: tuple[int, ...], key: jax.Array, num_critics: int = 1):
    """(networks, actor_params, critic_params), the critics stacked on a leading axis."""
    actor_key, *critic_keys = jax.random.split(key, 1 + num_critics)
    actor_graph, actor_state = nnx.split(HeadedMLP(layout.observation_sizes, hidden_sizes, layout.action_sizes,
                                                   rngs=nnx.Rngs(actor_key)))
    critic_graph, critic_params = make_critics(layout, hidden_sizes, critic_keys)
    return HeteroNetworks(layout, actor_graph, critic_graph), nnx.to_pure_dict(actor_state), critic_params


def init(key: jax.Array, layout: Layout, config):
    """(networks, training state) of a bare DDPG or SAC config's algorithm over ``layout``'s heads."""
    from .registry import as_algorithm

    return over(as_algorithm(config), layout).init(key, layout.observation_spec, layout.action_spec)


@dataclass(frozen=True)
class Headed:
    """An algorithm over a :class:`Layout`: its own update, action and state around per-device
    heads and a shared trunk. The algorithm provides ``headed_networks(layout, key)``,
    ``initial_state(key, actor, critics)`` and ``policy_head()`` (:class:`~.actor_critic.ActorCritic`);
    the rest of the :class:`~.interface.Algorithm` interface is its own."""

    algorithm: Any
    layout: Layout

    @property
    def name(self) -> str:
        return self.algorithm.name

    @property
    def config(self):
        return self.algorithm.config

    @property
    def on_policy(self) -> bool:
        return self.algorithm.on_policy

    @property
    def action_spaces(self) -> frozenset[str]:
        return self.algorithm.action_spaces

    @property
    def batch_size(self) -> int:
        return self.algorithm.batch_size

    @property
    def discount(self) -> float:
        return self.algorithm.discount

    def _check(self, observation_spec, action_spec) -> None:
        """The interface's specs must be the layout's stored ones (what the heads read)."""
        if (observation_spec, action_spec) != (self.layout.observation_spec, self.layout.action_spec):
            raise ValueError("over several device kinds, the specs are the layout's padded ones "
                             "(layout.observation_spec, layout.action_spec)")

    def init(self, key, observation_spec, action_spec):
        self._check(observation_spec, action_spec)
        net_key, state_key = jax.random.split(key)
        networks, actor, critic = self.algorithm.headed_networks(self.layout, net_key)
        return networks, self.algorithm.initial_state(state_key, actor, critic)

    def make_update_many(self, networks):
        return self.algorithm.make_update_many(networks)

    def actor_networks(self, observation_spec, action_spec, key):
        self._check(observation_spec, action_spec)
        networks, actor, _ = self.algorithm.headed_networks(self.layout, key)
        return networks, actor

    def actor_params(self, state):
        return self.algorithm.actor_params(state)

    def act(self, networks, actor_params, observation, key, explore: bool):
        return self.algorithm.act(networks, actor_params, observation, key, explore)

    def mean_action(self, networks, actor_params, observation):
        return self.algorithm.mean_action(networks, actor_params, observation)

    def export(self, networks, actor_params, version: PolicyVersion = NO_POLICY):
        raise ValueError("a policy over several device kinds exports one device at a time (export_device)")

    def export_device(self, actor_params, device_id: int, version: PolicyVersion = NO_POLICY):
        """(meta, arrays) of device ``device_id``'s policy for the numpy runtime."""
        return device_policy(self.layout, actor_params, device_id, self.algorithm.policy_head(), version)


def over(algorithm, layout: Layout):
    """``algorithm`` for the devices of ``layout``: itself for one kind; around per-device heads for
    several, if its registry entry trains several kinds (state observations only)."""
    from . import registry

    if not layout.padded or isinstance(algorithm, Headed):
        return algorithm
    entry = registry.get(algorithm.name)
    if not entry.heterogeneous:
        *most, last = registry.heterogeneous()
        raise ValueError(f"several device kinds train with an off-policy algorithm over per-device heads "
                         f"({', '.join(most)} or {last}), not {algorithm.name}")
    encoder = algorithm.config.encoder
    for name in ("image_fields", "ignore_fields"):  # the padded rows hold every field, flattened
        if getattr(encoder, name):
            raise ValueError(f"several device kinds train from state observations; "
                             f"{entry.section}.encoder.{name} must be empty")
    return Headed(algorithm, layout)


def export_device(algorithm, layout: Layout, actor_params, device_id: int,
                  version: PolicyVersion = NO_POLICY) -> tuple[dict, dict]:
    """(meta, arrays) of one device's policy for the numpy runtime: the algorithm's own export on a
    one-kind layout, the device's slice of the heads (a plain MLP on its own specs) on several."""
    algorithm = over(algorithm, layout)
    if isinstance(algorithm, Headed):
        return algorithm.export_device(actor_params, device_id, version)
    networks, _ = algorithm.actor_networks(layout.observation_spec, layout.action_spec, jax.random.key(0))
    return algorithm.export(networks, actor_params, version)
