"""The task protocol: reward and episode ends, kept apart from the device.

The actor loop calls the task after every device step. A task never touches
the hardware; it reads observations and actions. ``terminated`` means the
episode reached a terminal state (no bootstrapping past it); running out of
time is *truncation*, decided by ``max_episode_steps`` in the loop (or by
``truncated``, for a wrapped environment that truncates on its own).
"""

from __future__ import annotations

import abc

import numpy as np


class Task(abc.ABC):
    """Reward, termination and time limit for episodes on some device."""

    name: str = "task"
    max_episode_steps: int | None = None

    @abc.abstractmethod
    def reward(self, observation: dict[str, np.ndarray], action: np.ndarray,
               next_observation: dict[str, np.ndarray]) -> float:
        """r_t for taking ``action`` in o_t and arriving in o_{t+1}."""

    def terminated(self, next_observation: dict[str, np.ndarray]) -> bool:
        """Whether o_{t+1} is terminal (default: never)."""
        return False

    def truncated(self, next_observation: dict[str, np.ndarray]) -> bool:
        """Whether the episode stops here for another reason than a terminal state or the
        time limit (a wrapped environment's own truncation); bootstrapping continues past it.
        Default: never."""
        return False

    def episode_metrics(self, observations: list[dict[str, np.ndarray]]) -> dict[str, float]:
        """Task-specific figures of one finished episode (for evaluation)."""
        return {}
