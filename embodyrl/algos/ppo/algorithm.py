"""PPO behind :class:`~embodyrl.algos.interface.Algorithm` (its registry entry: :mod:`.entries`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...hal.steps import NO_POLICY
from ..interface import CONTINUOUS, DISCRETE, Configured
from . import learning
from .export import export_ppo
from .networks import make_networks


@dataclass(frozen=True)
class PPO(Configured):
    """On-policy: the learner cuts the actors' step streams into rollout segments
    (:mod:`embodyrl.algos.ppo.rollouts`); an update is one PPO iteration on ``[T, B]`` of them."""

    on_policy: ClassVar[bool] = True
    action_spaces: ClassVar[frozenset[str]] = frozenset({CONTINUOUS, DISCRETE})

    @property
    def batch_size(self) -> int:
        """Samples per iteration: T steps x B segments."""
        return self.config.rollout_length * self.config.rollouts_per_iteration

    def init(self, key, observation_spec, action_spec):
        return learning.init(key, observation_spec, action_spec, self.config)

    def make_update_many(self, networks):
        return learning.make_update(networks, self.config)

    def actor_networks(self, observation_spec, action_spec, key):
        networks, params = make_networks(observation_spec, action_spec, self.config, key)
        return networks, learning.actor_params(params)

    def actor_params(self, state):
        return learning.actor_params(state.params)

    def act(self, networks, actor_params, observation, key, explore: bool):
        """The action and the ``log_prob`` the learner's staleness corrections need (no value network)."""
        return learning.act_with_log_prob(networks, actor_params, observation, key, explore)

    def mean_action(self, networks, actor_params, observation):
        return networks.mode(actor_params, observation)

    def export(self, networks, actor_params, version=NO_POLICY):
        return export_ppo(networks, actor_params, version)
