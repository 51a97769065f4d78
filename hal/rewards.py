"""Rewards as their own objects, composed by tasks.

A :class:`Reward` maps ``(o_t, a_t, o_{t+1})`` to a float, as
:meth:`Task.reward` does; a task holds one and delegates to it
(:class:`RewardTask`). Three kinds:

* dense shaped terms, weighted and summed (:class:`Shaped` of :class:`Term`);
* sparse success detectors that pay 1.0 when a condition holds
  (:class:`Success`, e.g. :func:`within_distance`);
* a hook for a learned reward classifier (:class:`LearnedReward`) that calls
  the user's function on the observation (e.g. a success classifier trained
  on labelled camera frames, as HIL-SERL does).

Each reward can report its parts (:meth:`Shaped.terms_of`) for logging.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from .task import Task

Observation = dict[str, np.ndarray]


@runtime_checkable
class Reward(Protocol):
    def __call__(self, observation: Observation, action: np.ndarray,
                 next_observation: Observation) -> float:
        """r_t for taking ``action`` in o_t and arriving in o_{t+1}."""


@dataclass(frozen=True)
class Term:
    """One weighted term of a shaped reward."""

    name: str
    """Name shown when the reward is broken down for logging."""
    weight: float
    """Multiplier of the term's value (negative for costs)."""
    fn: Callable[[Observation, np.ndarray, Observation], float]
    """The unweighted value, from (o_t, a_t, o_{t+1})."""


@dataclass(frozen=True)
class Shaped:
    """A dense reward: ``sum(term.weight * term.fn(o, a, o'))`` in term order."""

    terms: tuple[Term, ...]

    def __post_init__(self):
        names = [t.name for t in self.terms]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"terms: need at least one, with distinct names; got {names}")

    def __call__(self, observation, action, next_observation) -> float:
        total = 0.0
        for term in self.terms:
            total += term.weight * float(term.fn(observation, action, next_observation))
        return total

    def terms_of(self, observation, action, next_observation) -> dict[str, float]:
        """Each weighted term by name: what the reward is made of."""
        return {t.name: t.weight * float(t.fn(observation, action, next_observation))
                for t in self.terms}


@dataclass(frozen=True)
class Success:
    """A sparse reward: ``value`` when ``detector(o')`` holds, else 0."""

    detector: Callable[[Observation], bool]
    """Whether o_{t+1} is a success."""
    value: float = 1.0
    """Paid on success."""

    def __call__(self, observation, action, next_observation) -> float:
        return self.value if self.detector(next_observation) else 0.0


def distance(field_a: str, field_b: str) -> Callable[[Observation], float]:
    """Euclidean distance between two observation fields (e.g. end effector and target)."""
    def fn(observation: Observation) -> float:
        return float(np.linalg.norm(observation[field_a] - observation[field_b]))
    fn.__name__ = f"distance({field_a}, {field_b})"
    return fn


def within_distance(field_a: str, field_b: str, threshold: float) -> Callable[[Observation], bool]:
    """A success detector: the two fields are closer than ``threshold``."""
    if threshold <= 0:
        raise ValueError(f"threshold: must be > 0, got {threshold}")
    measure = distance(field_a, field_b)
    return lambda observation: measure(observation) < threshold


class LearnedReward:
    """Calls a user classifier on o_{t+1}; optionally turns its score into 0/1.

    ``classifier(observation) -> float`` is any callable: a numpy model, a
    JAX function, a call to a service. With ``threshold`` the reward is
    ``1.0`` when the score reaches it (a learned success detector), else the
    raw score times ``scale``. A non-finite score raises ``ValueError`` (a
    broken classifier must not feed NaN into training).
    """

    def __init__(self, classifier: Callable[[Observation], float], *,
                 threshold: float | None = None, scale: float = 1.0):
        self.classifier = classifier
        self.threshold = threshold
        self.scale = scale

    def __call__(self, observation, action, next_observation) -> float:
        score = float(np.asarray(self.classifier(next_observation)).reshape(()))
        if not np.isfinite(score):
            raise ValueError(f"reward classifier returned a non-finite score {score}")
        if self.threshold is not None:
            return 1.0 if score >= self.threshold else 0.0
        return self.scale * score


class RewardTask(Task):
    """A task whose reward is a :class:`Reward` and whose end is a success detector."""

    def __init__(self, reward: Reward, *, name: str = "task", max_episode_steps: int | None = None,
                 terminate_on: Callable[[Observation], bool] | None = None):
        self.name = name
        self.max_episode_steps = max_episode_steps
        self._reward = reward
        self._terminate_on = terminate_on

    def reward(self, observation, action, next_observation) -> float:
        return self._reward(observation, action, next_observation)

    def terminated(self, next_observation) -> bool:
        return bool(self._terminate_on(next_observation)) if self._terminate_on else False
