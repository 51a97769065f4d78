"""DDPG and TD3 behind :class:`~embodyrl.algos.interface.Algorithm`, and their registry entries."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..actor_critic import ActorCritic
from ..interface import Entry
from . import learning
from .config import SECTION, DDPGConfig, td3
from .export import head
from .networks import make_networks


@dataclass(frozen=True)
class DDPG(ActorCritic):
    """DDPG, or TD3: the same code with TD3's options in ``config``."""

    learning = learning
    head = staticmethod(head)

    def actor_networks(self, observation_spec, action_spec, key):
        networks, actor, _ = make_networks(observation_spec, action_spec, self.config.hidden_sizes, key,
                                           self.config.num_critics, self.config.encoder)
        return networks, actor

    def mean_action(self, networks, actor_params, observation):
        return networks.policy(actor_params, observation)

    def headed_networks(self, layout, key):
        """(networks, actor, critics) with per-device heads around a shared trunk (:mod:`..heads`)."""
        from ..heads import make_networks as headed

        return headed(layout, self.config.hidden_sizes, key, self.config.num_critics)


ENTRIES = (
    Entry("ddpg", SECTION, DDPGConfig, partial(DDPG, "ddpg"), heterogeneous=True),
    Entry("td3", SECTION, DDPGConfig, lambda config: DDPG("td3", td3(config)), heterogeneous=True),
)
"""Plain DDPG first: :func:`embodyrl.algos.registry.as_algorithm` takes a bare config's first entry."""
