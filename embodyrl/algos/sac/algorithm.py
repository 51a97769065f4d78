"""SAC and RLPD behind :class:`~embodyrl.algos.interface.Algorithm` (their registry entries: :mod:`.entries`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..actor_critic import ActorCritic
from . import learning
from .export import head
from .networks import make_networks


@dataclass(frozen=True)
class SAC(ActorCritic):
    """SAC, or RLPD: the same code with RLPD's options in ``config``."""

    learning = learning
    head = staticmethod(head)

    def actor_networks(self, observation_spec, action_spec, key):
        networks, actor, _ = make_networks(observation_spec, action_spec, self.config, key)
        return networks, actor

    def mean_action(self, networks, actor_params, observation):
        return networks.mean_action(actor_params, observation)

    def headed_networks(self, layout, key):
        """(networks, actor, critics) with per-device heads around a shared trunk (:mod:`..heads_sac`)."""
        from ..heads_sac import make_networks as headed

        return headed(layout, self.config, key)
