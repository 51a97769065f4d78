"""Double DQN behind :class:`~embodyrl.algos.interface.Algorithm` (its registry entry: :mod:`.entries`).

Acting explores with ``epsilon_end``: the learner service's actors act at
the end of the schedule (the decay from ``epsilon_start`` is the
distributed learners' own, :mod:`embodyrl.algos.dqn.distributed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax.numpy as jnp

from ...hal.steps import NO_POLICY
from ..interface import DISCRETE, Configured
from . import learning
from .export import export_dqn
from .networks import make_networks


@dataclass(frozen=True)
class DQN(Configured):
    on_policy: ClassVar[bool] = False
    action_spaces: ClassVar[frozenset[str]] = frozenset({DISCRETE})

    def _epsilon(self, explore: bool) -> float:
        return self.config.epsilon_end if explore else 0.0

    def init(self, key, observation_spec, action_spec):
        return learning.init(key, observation_spec, action_spec, self.config)

    def make_update_many(self, networks):
        return learning.make_update_many(networks, self.config)

    def actor_networks(self, observation_spec, action_spec, key):
        return make_networks(observation_spec, action_spec, self.config.hidden_sizes, key)

    def actor_params(self, state):
        return state.params

    def act(self, networks, actor_params, observation, key, explore: bool):
        return learning.act(networks, actor_params, observation, key, self._epsilon(explore)), {}

    def mean_action(self, networks, actor_params, observation):
        return jnp.argmax(networks.q_values(actor_params, observation), axis=-1)

    def export(self, networks, actor_params, version=NO_POLICY):
        return export_dqn(networks, actor_params, self._epsilon(True), version)
