"""An in-memory n-step replay for one DQN learner's own actors (vectorised environments).

Each environment keeps its last n steps; a transition leaves when n steps
follow it or its episode ends, carrying the n-step return, the discount of
its bootstrap (gamma^m, or 0 past a termination; a truncation still
bootstraps) and the observation m steps later. A ring of fixed arrays,
uniform sampling. This is the distributed learners' local buffer; the
single learner service uses the persistent replay (:mod:`embodyrl.replay`).
"""

from __future__ import annotations

from collections import deque

import numpy as np


class NStepReplay:
    def __init__(self, observation_size: int, capacity: int, n_step: int, gamma: float, num_envs: int):
        self.capacity, self.n_step, self.gamma = capacity, n_step, gamma
        self.observation = np.zeros((capacity, observation_size), np.float32)
        self.next_observation = np.zeros((capacity, observation_size), np.float32)
        self.action = np.zeros(capacity, np.int32)
        self.ret = np.zeros(capacity, np.float32)
        self.discount = np.zeros(capacity, np.float32)
        self.size = 0
        self._next = 0
        self._pending = [deque() for _ in range(num_envs)]

    def add(self, observation, action, reward, terminated, truncated, next_observation) -> None:
        """One step of every environment (arrays with a leading env axis)."""
        for i, pending in enumerate(self._pending):
            pending.append((observation[i], int(action[i]), float(reward[i]), bool(terminated[i])))
            if terminated[i] or truncated[i]:
                while pending:
                    self._emit(pending, next_observation[i])
            elif len(pending) == self.n_step:
                self._emit(pending, next_observation[i])

    def _emit(self, pending: deque, bootstrap_observation) -> None:
        ret, scale = 0.0, 1.0
        for _, _, reward, terminated in pending:
            ret += scale * reward
            scale = 0.0 if terminated else scale * self.gamma
        observation, action, _, _ = pending.popleft()
        j = self._next
        self.observation[j], self.action[j], self.ret[j] = observation, action, ret
        self.discount[j], self.next_observation[j] = scale, bootstrap_observation
        self._next = (j + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, rng: np.random.Generator, batch_size: int, field: str = "observation") -> dict:
        """A batch in the persistent replay's keys: ``reward`` is the n-step return."""
        idx = rng.integers(0, self.size, batch_size)
        return {"observation": {field: self.observation[idx]}, "action": self.action[idx],
                "reward": self.ret[idx], "discount": self.discount[idx],
                "next_observation": {field: self.next_observation[idx]}}
