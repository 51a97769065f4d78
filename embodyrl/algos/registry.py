"""The algorithms a learner can run, by name, behind one interface.

``ddpg`` and ``td3`` share DDPG's code and config section (``td3`` applies
TD3's options on top); ``sac`` and ``rlpd`` share SAC's. Each resolves to an
:class:`OffPolicy`: build networks and state, the update, the action, and
the deterministic action used for evaluation and export. ``ppo`` resolves
to an :class:`OnPolicy` with the same actor side (its action carries the
log-probability the learner's staleness corrections need); its learner is
:mod:`embodyrl.onpolicy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from . import ddpg, ppo, sac

NAMES = ("ddpg", "td3", "sac", "rlpd", "ppo")
ON_POLICY = ("ppo",)


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
                                                    self.config.num_critics, self.config.encoder)
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


@dataclass(frozen=True)
class OnPolicy:
    """PPO behind the actor-side interface of :class:`OffPolicy` (its learner is :mod:`embodyrl.onpolicy`)."""

    name: str
    config: Any
    module: Any = ppo

    def init(self, key, observation_spec, action_spec):
        return ppo.init(key, observation_spec, action_spec, self.config)

    def actor_networks(self, observation_spec, action_spec, key):
        networks, params = ppo.make_networks(observation_spec, action_spec, self.config, key)
        return networks, ppo.actor_params(params)

    def act(self, networks, actor_params, observation, key, explore: bool):
        return ppo.act_with_log_prob(networks, actor_params, observation, key, explore)

    def mean_action(self, networks, actor_params, observation) -> jax.Array:
        return networks.mode(actor_params, observation)

    @property
    def discount(self) -> float:
        return self.config.discount


def resolve(name: str, ddpg_config: ddpg.DDPGConfig, sac_config: sac.SACConfig,
            ppo_config: ppo.PPOConfig | None = None) -> OffPolicy | OnPolicy:
    if name == "ddpg":
        return OffPolicy(name, ddpg_config, ddpg)
    if name == "td3":
        return OffPolicy(name, ddpg.td3(ddpg_config), ddpg)
    if name == "sac":
        return OffPolicy(name, sac_config, sac)
    if name == "rlpd":
        return OffPolicy(name, sac.rlpd(sac_config), sac)
    if name == "ppo":
        return OnPolicy(name, ppo_config or ppo.PPOConfig())
    raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(NAMES)}")


def as_algorithm(spec) -> OffPolicy | OnPolicy:
    """An :class:`OffPolicy` (or :class:`OnPolicy`) from itself or from a bare DDPG, SAC or PPO config."""
    if isinstance(spec, (OffPolicy, OnPolicy)):
        return spec
    if isinstance(spec, ppo.PPOConfig):
        return OnPolicy("ppo", spec)
    if isinstance(spec, ddpg.DDPGConfig):
        return OffPolicy("ddpg", spec, ddpg)
    if isinstance(spec, sac.SACConfig):
        return OffPolicy("sac", spec, sac)
    raise TypeError(f"not an algorithm or algorithm config: {spec!r}")
