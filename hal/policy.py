"""What the actor loop needs from a policy, whatever computes it.

A policy maps an observation dict to an action, holds the newest weights it
was given and says which :class:`PolicyVersion` they are. The learner's JAX
policy and the HAL's numpy runtime both implement it; each draws its
exploration noise from its own RNG.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from .specs import ArraySpec
from .steps import NO_POLICY, PolicyVersion


@runtime_checkable
class Policy(Protocol):
    version: PolicyVersion

    def act(self, observation: dict[str, np.ndarray], *, explore: bool) -> tuple[np.ndarray, dict]:
        """(action, extras); extras may hold ``log_prob`` of a stochastic action."""

    def load_weights(self, version: PolicyVersion, arrays: dict[str, np.ndarray]) -> None:
        """Replace the parameters with ``arrays`` (flat names, as on the wire)."""


class UniformRandomPolicy:
    """Uniform actions within the action bounds: the baseline and the warm-up."""

    version = NO_POLICY

    def __init__(self, action_spec: ArraySpec, seed: int | None = None):
        self.action_spec = action_spec
        self.rng = np.random.default_rng(seed)
        width = action_spec.maximum - action_spec.minimum
        self._log_prob = float(-np.log(width).sum())

    def act(self, observation, *, explore: bool = True):
        return self.action_spec.sample_uniform(self.rng), {"log_prob": self._log_prob}

    def load_weights(self, version, arrays) -> None:
        raise TypeError("UniformRandomPolicy has no weights")
