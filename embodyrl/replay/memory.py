"""An in-memory ring of step rows that serves transitions by index.

Rows from many (actor, device) streams interleave in the ring. Each row keeps
``next_index``, the ring position of its successor in the same episode, set
when that successor arrives, so a transition's next observation is a lookup,
never a copy. A row is a valid transition start when it is not a final row,
its successor has arrived, and the successor has not been overwritten since
(checked by episode id and step index at sample time).
"""

from __future__ import annotations

import numpy as np

from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import SCALAR_COLUMNS, Steps


class StepReplay:
    def __init__(self, capacity: int, observation_spec: DictSpec, action_spec: ArraySpec):
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2, got {capacity}")
        self.capacity = capacity
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self.observation = {k: np.zeros((capacity, *s.shape), s.dtype) for k, s in observation_spec.items()}
        self.action = np.zeros((capacity, *action_spec.shape), action_spec.dtype)
        self.proposed_action = np.zeros_like(self.action)
        self.columns = {name: np.zeros(capacity, dtype) for name, dtype in SCALAR_COLUMNS.items()}
        self.next_index = np.full(capacity, -1, np.int64)
        self._cursor = 0
        self.size = 0
        self.rows_added = 0
        self._open: dict[tuple[int, int], int] = {}  # stream -> ring index of its last, unfinished row

    def add(self, steps: Steps) -> None:
        """Append a batch of one stream's consecutive rows."""
        n = len(steps)
        if n > self.capacity:
            raise ValueError(f"batch of {n} rows exceeds the capacity {self.capacity}")
        idx = (self._cursor + np.arange(n)) % self.capacity
        for k, column in self.observation.items():
            column[idx] = steps.observation[k]
        self.action[idx] = steps.action
        self.proposed_action[idx] = steps.proposed_action
        for name, column in self.columns.items():
            column[idx] = getattr(steps, name)
        nxt = np.roll(idx, -1)
        nxt[-1] = -1
        self.next_index[idx] = np.where(steps.final, -1, nxt)
        stream = (int(steps.actor_id[0]), int(steps.device_id[0]))
        prev = self._open.pop(stream, None)
        if prev is not None and self._continues(prev, steps):
            self.next_index[prev] = idx[0]
        if not steps.final[-1]:
            self._open[stream] = int(idx[-1])
        self._cursor = int((self._cursor + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        self.rows_added += n

    def _continues(self, prev: int, steps: Steps) -> bool:
        c = self.columns
        return (c["episode_id"][prev] == steps.episode_id[0]
                and c["step_index"][prev] + 1 == steps.step_index[0]
                and not c["final"][prev])

    def _valid(self, idx: np.ndarray) -> np.ndarray:
        c = self.columns
        nxt = self.next_index[idx]
        ok = (~c["final"][idx]) & (nxt >= 0)
        safe = np.where(ok, nxt, 0)
        ok &= c["episode_id"][safe] == c["episode_id"][idx]
        ok &= c["step_index"][safe] == c["step_index"][idx] + 1
        return ok

    def sample_indices(self, rng: np.random.Generator, batch_size: int) -> np.ndarray:
        """Uniform over valid transition starts (rejection sampling)."""
        chosen = np.empty(0, np.int64)
        for _ in range(64):
            draw = rng.integers(0, self.size, size=2 * batch_size)
            chosen = np.concatenate([chosen, draw[self._valid(draw)]])
            if len(chosen) >= batch_size:
                return chosen[:batch_size]
        raise RuntimeError(f"replay of {self.size} rows has too few complete transitions to sample")

    def sample(self, rng: np.random.Generator, batch_size: int, discount: float) -> dict:
        """One-step transitions: o, a, r, discount (gamma, or 0 at termination), o'."""
        idx = self.sample_indices(rng, batch_size)
        nxt = self.next_index[idx]
        c = self.columns
        return {
            "observation": {k: v[idx] for k, v in self.observation.items()},
            "action": self.action[idx].astype(np.float32, copy=False),
            "reward": c["reward"][idx],
            "discount": np.where(c["terminated"][idx], 0.0, discount).astype(np.float32),
            "next_observation": {k: v[nxt] for k, v in self.observation.items()},
        }
