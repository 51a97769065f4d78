"""The off-policy algorithms a learner can run, by name, behind one interface.

``ddpg`` and ``td3`` share DDPG's code and config section (``td3`` applies
TD3's options on top); ``sac`` and ``rlpd`` share SAC's. Each resolves to an
:class:`OffPolicy`: build networks and state, the update, the action, and
the deterministic action used for evaluation and export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from . import ddpg, sac

NAMES = ("ddpg", "td3", "sac", "rlpd")


@dataclass(frozen=True)
class OffPolicy:
    name: str
    config: Any
    module: Any

    def init(self, key, observation_spec, action_spec):
        return self.module.init(key, observation_spec, action_spec, self.config)

    def make_update_many(self, networks):
        return self.module.make_update_many(networks, self.config)

    def actor_networks(self, observation_spec, action_spec, key):
        """(networks, fresh actor parameters): what an actor needs to act."""
        if self.module is ddpg:
            networks, actor, _ = ddpg.make_networks(observation_spec, action_spec, self.config.hidden_sizes, key,
                                                    self.config.num_critics)
        else:
            networks, actor, _ = sac.make_networks(observation_spec, action_spec, self.config, key)
        return networks, actor

    def act(self, networks, actor_params, observation, key, explore: bool):
        return self.module.act(networks, self.config, actor_params, observation, key, explore)

    def mean_action(self, networks, actor_params, observation) -> jax.Array:
        if self.module is ddpg:
            return networks.policy(actor_params, observation)
        return networks.mean_action(actor_params, observation)

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def discount(self) -> float:
        return self.config.discount


def resolve(name: str, ddpg_config: ddpg.DDPGConfig, sac_config: sac.SACConfig) -> OffPolicy:
    if name == "ddpg":
        return OffPolicy(name, ddpg_config, ddpg)
    if name == "td3":
        return OffPolicy(name, ddpg.td3(ddpg_config), ddpg)
    if name == "sac":
        return OffPolicy(name, sac_config, sac)
    if name == "rlpd":
        return OffPolicy(name, sac.rlpd(sac_config), sac)
    raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(NAMES)}")


def as_algorithm(spec) -> OffPolicy:
    """An :class:`OffPolicy` from itself or from a bare DDPG or SAC config."""
    if isinstance(spec, OffPolicy):
        return spec
    if isinstance(spec, ddpg.DDPGConfig):
        return OffPolicy("ddpg", spec, ddpg)
    if isinstance(spec, sac.SACConfig):
        return OffPolicy("sac", spec, sac)
    raise TypeError(f"not an algorithm or algorithm config: {spec!r}")
