"""The learner's policy on the actor side: the algorithm's ``act`` under ``jax.jit``, for one
device of a run's layout; and the saved ``policy/`` directory.

Implements the HAL's :class:`~embodyrl.hal.policy.Policy`. Exploration noise
comes from a JAX key folded with a step counter inside the jitted call, so
acting costs one dispatch per step.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .algos.heads import over
from .algos.registry import as_algorithm
from .hal import params as flat_params
from .hal.layout import Layout
from .hal.specs import ArraySpec, DictSpec
from .hal.steps import NO_POLICY, PolicyVersion

POLICY_FILE = "policy.json"
WEIGHTS_FILE = "weights.npz"


class JaxPolicy:
    """The learner's policy acting for device ``device_id`` of ``layout``: the observation padded
    in, the algorithm's jitted ``act``, the device's own action out (with one device kind, padding
    and unpadding are the identity).

    ``algorithm``: an :class:`~embodyrl.algos.interface.Algorithm`, or a bare algorithm config
    (DDPG, SAC, PPO, DQN: its plain algorithm); over several kinds it acts through its heads.
    """

    def __init__(self, algorithm, layout: Layout, device_id: int = 0, *, seed: int = 0):
        algorithm = over(as_algorithm(algorithm), layout)
        kind = layout.kinds[layout.kind_of(device_id)]
        self.observation_spec, self.action_spec = kind.observation_spec, kind.action_spec
        self.algorithm, self.layout, self.device_id = algorithm, layout, device_id
        networks, self.params = algorithm.actor_networks(layout.observation_spec, layout.action_spec,
                                                         jax.random.key(seed))
        self.version: PolicyVersion = NO_POLICY
        self._key = jax.random.key(seed + 1)
        self._count = 0

        @partial(jax.jit, static_argnames="explore")
        def _act(params, observation, key, count, explore):
            obs = jax.tree.map(lambda x: x[None], observation)
            action, extras = algorithm.act(networks, params, obs, jax.random.fold_in(key, count), explore)
            return action[0], jax.tree.map(lambda x: x[0], extras)

        self._act = _act

    @classmethod
    def for_specs(cls, observation_spec: DictSpec, action_spec: ArraySpec, algorithm, seed: int = 0) -> JaxPolicy:
        """The policy of a device with these specs (a one-kind layout)."""
        return cls(algorithm, Layout.of("device", observation_spec, action_spec), seed=seed)

    def act(self, observation, *, explore: bool = True):
        self._count += 1  # the key is folded inside the jitted call: one dispatch per action
        padded = self.layout.pad_observation(self.device_id, observation)
        action, extras = self._act(self.params, padded, self._key, self._count, explore)
        return (self.layout.unpad_action(self.device_id, np.asarray(action)),
                {k: float(v) for k, v in extras.items()})

    def load_weights(self, version: PolicyVersion, arrays: dict[str, np.ndarray]) -> None:
        actor = flat_params.subtree(arrays, "actor")
        tree = flat_params.unflatten(actor)
        expected = jax.tree.structure(self.params)
        if jax.tree.structure(tree) != expected:
            raise ValueError(f"weights {sorted(actor)} do not fit the actor network")
        self.params = jax.tree.map(jnp.asarray, tree)
        self.version = version


def save_policy(directory: Path, version: PolicyVersion, weights: dict[str, np.ndarray],
                observation_spec: DictSpec, action_spec: ArraySpec, algorithm) -> None:
    """Write weights (npz, no pickle) and what is needed to rebuild the network."""
    import dataclasses

    algorithm = as_algorithm(algorithm)
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / WEIGHTS_FILE, **weights)
    meta = {"algorithm": algorithm.name, "version": list(version),
            "observation_spec": observation_spec.to_msg(), "action_spec": action_spec.to_msg(),
            "config": dataclasses.asdict(algorithm.config),
            "hidden_sizes": list(algorithm.config.hidden_sizes)}
    (directory / POLICY_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def read_saved(directory: Path) -> tuple[dict, dict[str, np.ndarray], PolicyVersion]:
    """(``policy.json``, the weights by published name, their version) of a saved ``policy/`` directory."""
    meta = json.loads((Path(directory) / POLICY_FILE).read_text())
    with np.load(Path(directory) / WEIGHTS_FILE, allow_pickle=False) as data:
        weights = {k: data[k] for k in data.files}
    return meta, weights, PolicyVersion(*meta["version"])


def load_policy(directory: Path, algorithm, seed: int = 0) -> JaxPolicy:
    """A saved policy, acting on the specs its ``policy.json`` records."""
    meta, weights, version = read_saved(directory)
    policy = JaxPolicy.for_specs(DictSpec.from_msg(meta["observation_spec"]),
                                 ArraySpec.from_msg(meta["action_spec"]), algorithm, seed)
    policy.load_weights(version, weights)
    return policy


def load_run_policies(run_dir: Path, algorithm, layout: Layout, seed: int = 0) -> list[JaxPolicy]:
    """A run's saved policy acting for each device kind of its layout, by device id."""
    return load_policies(Path(run_dir) / "policy", algorithm, layout, seed)


def load_policies(directory: Path, algorithm, layout: Layout, seed: int = 0) -> list[JaxPolicy]:
    """The policy saved in ``directory`` (a run's ``policy/``, or a snapshot of it) acting for each
    device kind of ``layout``, by device id."""
    _, weights, version = read_saved(directory)
    policies = []
    for device_id in range(len(layout.kinds)):
        policy = JaxPolicy(algorithm, layout, device_id, seed=seed)
        policy.load_weights(version, weights)
        policies.append(policy)
    return policies
