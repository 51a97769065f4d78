"""SAC and RLPD behind :class:`~embodyrl.algos.interface.Algorithm`, and their registry entries."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..actor_critic import ActorCritic
from ..interface import Entry
from . import learning
from .config import SECTION, SACConfig, rlpd
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


RLPD_MIX = {"demonstration": 0.5, "online": 0.5}
"""RLPD's symmetric sampling: half of every batch from demonstrations and interventions, half online."""
ENTRIES = (
    Entry("sac", SECTION, SACConfig, partial(SAC, "sac"), heterogeneous=True),
    Entry("rlpd", SECTION, SACConfig, lambda config: SAC("rlpd", rlpd(config)), heterogeneous=True,
          defaults={"learner": {"mix": RLPD_MIX}}),
)
"""Plain SAC first: :func:`embodyrl.algos.registry.as_algorithm` takes a bare config's first entry."""
