"""A sum tree over row slots for proportional prioritised sampling (Schaul et al., 2016).

Leaves are slot priorities; each inner node holds the sum of its children,
so drawing a slot with probability p_i / sum(p) is a descent of
log2(capacity) levels, vectorised over the batch in numpy.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    def __init__(self, capacity: int):
        self.leaves = 1 << max(0, int(capacity - 1).bit_length())
        self.capacity = capacity
        self.tree = np.zeros(2 * self.leaves, np.float64)  # node 1 is the root

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.tree[self.leaves + np.asarray(slots)]

    def set(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        slots = np.asarray(slots, np.int64)
        priorities = np.asarray(priorities, np.float64)
        if (priorities < 0).any() or not np.isfinite(priorities).all():
            raise ValueError("priorities must be finite and non-negative")
        if len(slots) == 0:
            return
        # Last write wins for duplicate slots, as for sequential assignment.
        _, last = np.unique(slots[::-1], return_index=True)
        keep = len(slots) - 1 - last
        nodes = self.leaves + slots[keep]
        self.tree[nodes] = priorities[keep]
        nodes = np.unique(nodes // 2)
        while True:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] <= 1:
                break
            nodes = np.unique(nodes // 2)

    def set_range(self, first: int, count: int, priority: float) -> None:
        self.set(np.arange(first, first + count), np.full(count, priority))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` slots drawn with probability proportional to priority."""
        if self.total <= 0:
            raise RuntimeError("prioritised replay has no row with positive priority")
        target = rng.random(n) * self.total
        node = np.ones(n, np.int64)
        while node[0] < self.leaves:
            left = 2 * node
            go_right = target >= self.tree[left]
            target = np.where(go_right, target - self.tree[left], target)
            node = np.where(go_right, left + 1, left)
        slots = node - self.leaves
        # Float round-off can land on an empty leaf at the right edge; clamp to a real slot.
        return np.minimum(slots, self.capacity - 1)
