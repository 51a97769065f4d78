"""One policy for devices of different shapes: per-device input and output heads around a shared trunk.

Design (padded rows, routed by device id). A heterogeneous run declares its
device kinds up front, indexed by the ``device_id`` their actors send
(:class:`HeteroLayout`). The learner admits an actor's device only if its
specs equal the kind declared for that id, and pads each incoming row into
one shared row layout before the replay stores it:

* ``observation/features``: the device's observation, flattened in its spec's
  field order, zero-padded to the widest device's size (float32);
* ``observation/device``: the device id (int32), the route;
* ``action``: the device's action mapped to [-1, 1] by its own bounds,
  zero-padded to the widest action.

So the replay, the sampler, n-step returns and the jitted scan stay as they
are, and a batch mixes devices. The networks run every input head on every
row and keep, per row, the head of its device (``jnp.take_along_axis``);
rows of device A thus send no gradient to device B's heads, while the trunk
learns from all. Output heads write the device's action dimensions; padded
dimensions are zero and no critic reads them. DDPG/TD3's update
(:mod:`embodyrl.algos.ddpg`) runs unchanged on these networks.

Actors act through :class:`DevicePolicy`: the same published weights,
padded observation in, the device's slice of the unit action out, scaled to
its bounds. SAC and RLPD run on the same heads (:mod:`embodyrl.algos.heads_sac`).
Scope: state observations (a device that observes an image is refused by name).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..hal import params as flat_params
from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import NO_POLICY, PolicyVersion, Steps
from .networks import ActionScale
from .runtime_graph import device_policy

FEATURES, DEVICE = "features", "device"


@dataclass(frozen=True)
class DeviceKind:
    name: str
    observation_spec: DictSpec
    action_spec: ArraySpec


@dataclass(frozen=True)
class HeteroLayout:
    """The declared devices, by device id (``kinds[i]`` is device ``i``), and the padded row layout."""

    kinds: tuple[DeviceKind, ...]
    observation_spec: DictSpec = field(init=False)
    action_spec: ArraySpec = field(init=False)

    def __post_init__(self):
        if not self.kinds:
            raise ValueError("a heterogeneous layout needs at least one device kind")
        for kind in self.kinds:
            ActionScale(kind.action_spec)  # finite bounds, or a clear error naming the action
            for spec in kind.observation_spec.specs:
                if spec.dtype == np.uint8 or len(spec.shape) >= 3:
                    raise ValueError(f"heterogeneous devices: {kind.name!r} observes an image ({spec.name!r}, "
                                     f"{spec.dtype}{list(spec.shape)}); state observations only")
        width = max(self.observation_sizes)
        object.__setattr__(self, "observation_spec", DictSpec.of(
            ArraySpec(FEATURES, (width,), np.float32), ArraySpec(DEVICE, (), np.int32, 0, len(self.kinds) - 1)))
        object.__setattr__(self, "action_spec", ArraySpec("action", (max(self.action_sizes),), np.float32, -1, 1))

    @property
    def observation_sizes(self) -> tuple[int, ...]:
        return tuple(sum(s.size for s in k.observation_spec.specs) for k in self.kinds)

    @property
    def action_sizes(self) -> tuple[int, ...]:
        return tuple(k.action_spec.size for k in self.kinds)

    def refusal(self, device_id: int, name: str, observation_spec: DictSpec, action_spec: ArraySpec) -> str | None:
        """Why a declared device does not fit this layout (None when it does)."""
        if not 0 <= device_id < len(self.kinds):
            return f"device {name!r}: id {device_id} is not one of the {len(self.kinds)} declared device kinds"
        kind = self.kinds[device_id]
        if observation_spec != kind.observation_spec or action_spec != kind.action_spec:
            return f"device {name!r} (id {device_id}) has specs that differ from declared kind {kind.name!r}"
        return None

    def pad_observation(self, device_id: int, observation) -> dict[str, np.ndarray]:
        """One device's observation (optionally batched) as padded ``features`` plus its ``device`` id."""
        spec = self.kinds[device_id].observation_spec
        parts = [np.asarray(observation[s.name], np.float32) for s in spec.specs]
        lead = parts[0].shape[: parts[0].ndim - len(spec.specs[0].shape)]
        flat = np.concatenate([p.reshape(*lead, -1) for p in parts], axis=-1)
        padded = np.zeros((*lead, self.observation_spec[FEATURES].shape[0]), np.float32)
        padded[..., : flat.shape[-1]] = flat
        return {FEATURES: padded, DEVICE: np.full(lead, device_id, np.int32)}

    def pad_action(self, device_id: int, action) -> np.ndarray:
        """A device's action (env units) as the padded unit action the replay stores."""
        scale = ActionScale(self.kinds[device_id].action_spec)
        unit = (np.asarray(action, np.float32) - scale.center) / scale.half_range
        out = np.zeros((*unit.shape[:-1], self.action_spec.shape[0]), np.float32)
        out[..., : unit.shape[-1]] = np.clip(unit, -1.0, 1.0)
        return out

    def pad_steps(self, device_id: int, steps: Steps) -> Steps:
        """A batch of one device's rows in the padded layout (everything else unchanged)."""
        from dataclasses import replace

        return replace(steps, observation=self.pad_observation(device_id, steps.observation),
                       action=self.pad_action(device_id, steps.action),
                       proposed_action=self.pad_action(device_id, steps.proposed_action))


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

    layout: HeteroLayout
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

    def q_value(self, critic_params, observation, action) -> jax.Array:
        return self.q_values(critic_params, observation, action)[0]


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


def make_critics(layout: HeteroLayout, hidden_sizes: tuple[int, ...], keys, layer_norm: bool = False):
    """(graph, parameters stacked on a leading axis) of one headed critic per key."""
    critic_in = [n + m for n, m in zip(layout.observation_sizes, layout.action_sizes, strict=True)]
    critics = [nnx.split(HeadedMLP(critic_in, hidden_sizes, [1] * len(critic_in), rngs=nnx.Rngs(k),
                                   layer_norm=layer_norm)) for k in keys]
    return critics[0][0], jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.to_pure_dict(s) for _, s in critics])


def make_networks(layout: HeteroLayout, hidden_sizes: tuple[int, ...], key: jax.Array, num_critics: int = 1):
    """(networks, actor_params, critic_params), the critics stacked on a leading axis."""
    actor_key, *critic_keys = jax.random.split(key, 1 + num_critics)
    actor_graph, actor_state = nnx.split(HeadedMLP(layout.observation_sizes, hidden_sizes, layout.action_sizes,
                                                   rngs=nnx.Rngs(actor_key)))
    critic_graph, critic_params = make_critics(layout, hidden_sizes, critic_keys)
    return HeteroNetworks(layout, actor_graph, critic_graph), nnx.to_pure_dict(actor_state), critic_params


def init(key: jax.Array, layout: HeteroLayout, config):
    """(networks, training state) of a bare DDPG or SAC config's algorithm over ``layout``'s heads."""
    from .registry import as_algorithm

    return hetero(as_algorithm(config), layout).init(key)


@dataclass(frozen=True)
class Headed:
    """An algorithm over a :class:`HeteroLayout`: its own update, action and state around per-device
    heads and a shared trunk. The algorithm provides ``headed_networks(layout, key)``,
    ``initial_state(key, actor, critics)`` and ``policy_head()`` (:class:`~.actor_critic.ActorCritic`);
    the rest of the :class:`~.interface.Algorithm` interface is its own."""

    algorithm: Any
    layout: HeteroLayout

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

    def init(self, key, observation_spec=None, action_spec=None):
        """The specs are the layout's padded ones; they may be omitted."""
        net_key, state_key = jax.random.split(key)
        networks, actor, critic = self.algorithm.headed_networks(self.layout, net_key)
        return networks, self.algorithm.initial_state(state_key, actor, critic)

    def make_update_many(self, networks):
        return self.algorithm.make_update_many(networks)

    def actor_networks(self, observation_spec=None, action_spec=None, key=None):
        networks, actor, _ = self.algorithm.headed_networks(self.layout, key if key is not None else jax.random.key(0))
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


def hetero(algorithm, layout: HeteroLayout) -> Headed:
    """``algorithm`` over the headed networks of ``layout``, if its registry entry trains several kinds."""
    from . import registry

    if not registry.get(algorithm.name).heterogeneous:
        *most, last = registry.heterogeneous()
        raise ValueError(f"heterogeneous devices: {algorithm.name} is not supported ({', '.join(most)} or {last})")
    if algorithm.config.encoder.image_fields:
        raise ValueError("heterogeneous devices: state observations only (no image encoder)")
    return Headed(algorithm, layout)


class DevicePolicy:
    """The shared policy acting for one device kind (the HAL ``Policy`` protocol)."""

    def __init__(self, algorithm: Headed, device_id: int, seed: int = 0):
        self.layout, self.device_id = algorithm.layout, device_id
        kind = self.layout.kinds[device_id]
        self.observation_spec, self.action_spec = kind.observation_spec, kind.action_spec
        self._scale = ActionScale(kind.action_spec)
        networks, self.params = algorithm.actor_networks(key=jax.random.key(seed))
        self.version: PolicyVersion = NO_POLICY
        self._key, self._count = jax.random.key(seed + 1), 0

        @partial(jax.jit, static_argnames="explore")
        def _act(params, observation, key, count, explore):
            obs = jax.tree.map(lambda x: x[None], observation)
            action, _ = algorithm.act(networks, params, obs, jax.random.fold_in(key, count), explore)
            return action[0]

        self._act = _act

    def act(self, observation, *, explore: bool = True):
        self._count += 1  # the key is folded inside the jitted call: one dispatch per action
        padded = self.layout.pad_observation(self.device_id, observation)
        unit = np.asarray(self._act(self.params, padded, self._key, self._count, explore))
        n = self.action_spec.size
        action = unit[:n].reshape(self.action_spec.shape) * self._scale.half_range + self._scale.center
        return self.action_spec.clip(action.astype(self.action_spec.dtype)), {}

    def load_weights(self, version: PolicyVersion, arrays) -> None:
        tree = flat_params.unflatten(flat_params.subtree(arrays, "actor"))
        if jax.tree.structure(tree) != jax.tree.structure(self.params):
            raise ValueError("weights do not fit the headed actor network")
        self.params = jax.tree.map(jnp.asarray, tree)
        self.version = version
