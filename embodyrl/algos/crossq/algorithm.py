"""CrossQ behind :class:`~embodyrl.algos.interface.Algorithm` (its registry entry: :mod:`.entries`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...hal.steps import NO_POLICY
from ..actor_critic import ActorCritic
from . import learning
from .export import export_crossq
from .networks import acting, make_networks


@dataclass(frozen=True)
class CrossQ(ActorCritic):
    """CrossQ: its actor acts and is published with its norms' running moments (:func:`~.networks.acting`)."""

    learning = learning

    def actor_networks(self, observation_spec, action_spec, key):
        networks, actor, actor_stats, _, _ = make_networks(observation_spec, action_spec, self.config, key)
        return networks, acting(actor, actor_stats)

    def actor_params(self, state):
        return learning.actor_params(state)

    def mean_action(self, networks, actor_params, observation):
        return networks.mean_action(actor_params, observation)

    def export(self, networks, actor_params, version=NO_POLICY):
        return export_crossq(networks, actor_params, version)
