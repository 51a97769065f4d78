"""What the DDPG and SAC adapters share: a bounded actor and critics trained from replay.

Both keep ``actor_params`` in their training state, build it with their
``learning`` module's ``init``/``initial_state``, act through its ``act``,
and export the actor as a :class:`~embodyrl.algos.runtime_graph.PolicyHead`
after the MLP. A subclass names its ``learning`` module and ``head``, and
says how it builds its actor's networks, plain or over a heterogeneous layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from ..hal.steps import NO_POLICY
from .interface import CONTINUOUS, Configured
from .runtime_graph import PolicyHead, bounded_policy


@dataclass(frozen=True)
class ActorCritic(Configured):
    on_policy: ClassVar[bool] = False
    action_spaces: ClassVar[frozenset[str]] = frozenset({CONTINUOUS})
    learning: ClassVar[ModuleType]
    """The package's ``learning`` module: ``init``, ``initial_state``, ``make_update_many``, ``act``."""

    @staticmethod
    def head(config) -> PolicyHead:
        """The ops after the actor's MLP and the exploration, for the numpy runtime."""
        raise NotImplementedError

    def init(self, key, observation_spec, action_spec):
        return self.learning.init(key, observation_spec, action_spec, self.config)

    def make_update_many(self, networks):
        return self.learning.make_update_many(networks, self.config)

    def actor_params(self, state):
        return state.actor_params

    def act(self, networks, actor_params, observation, key, explore: bool):
        return self.learning.act(networks, self.config, actor_params, observation, key, explore)

    def export(self, networks, actor_params, version=NO_POLICY):
        return bounded_policy(networks, actor_params, self.policy_head(), version)

    # -- what :class:`embodyrl.algos.heads.Headed` asks of an algorithm over several device kinds
    def initial_state(self, key, actor_params, critic_params) -> Any:
        """The training state around parameters of any networks with this algorithm's interface."""
        return self.learning.initial_state(key, actor_params, critic_params, self.config)

    def policy_head(self) -> PolicyHead:
        return self.head(self.config)
