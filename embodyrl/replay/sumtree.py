"""Sum trees over row slots for proportional prioritised sampling (Schaul et al., 2016).

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


class SourceTrees:
    """One :class:`SumTree` per source (made when its first row arrives), so that a draw from a
    group of sources (the demonstration side of a mix) descends only its own trees: exact
    proportional sampling within the group, however small its share of the total priority.

    A slot's priority lives in the tree of its row's source; the others hold 0 there.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.trees: dict[int, SumTree] = {}

    def _tree(self, source: int) -> SumTree:
        if source not in self.trees:
            self.trees[source] = SumTree(self.capacity)
        return self.trees[source]

    def set(self, slots: np.ndarray, sources: np.ndarray, priorities: np.ndarray) -> None:
        slots, sources = np.asarray(slots, np.int64), np.asarray(sources)
        priorities = np.broadcast_to(np.asarray(priorities, np.float64), slots.shape)
        for source in np.unique(sources):
            mine = sources == source
            self._tree(int(source)).set(slots[mine], priorities[mine])

    def clear(self, first: int, count: int) -> None:
        """Zero slots ``first .. first + count - 1`` in every tree (an evicted chunk)."""
        for tree in self.trees.values():
            tree.set_range(first, count, 0.0)

    def get(self, slots: np.ndarray, sources: np.ndarray) -> np.ndarray:
        slots, sources = np.asarray(slots, np.int64), np.asarray(sources)
        out = np.zeros(len(slots))
        for source, tree in self.trees.items():
            mine = sources == source
            out[mine] = tree.get(slots[mine])
        return out

    def total(self, group: tuple[int, ...] | None = None) -> float:
        """The priority mass of ``group``'s sources (None: every source)."""
        return sum(t.total for s, t in self.trees.items() if group is None or s in group)

    def sample(self, rng: np.random.Generator, n: int, group: tuple[int, ...] | None = None) -> np.ndarray:
        """``n`` slots of ``group``'s rows (None: any), drawn with probability proportional to
        priority: a tree by its total, then a descent; shuffled, so any prefix is a fair draw."""
        trees = [t for s, t in self.trees.items() if (group is None or s in group) and t.total > 0]
        if not trees:
            raise RuntimeError("prioritised replay has no row with positive priority")
        totals = np.array([t.total for t in trees])
        counts = rng.multinomial(n, totals / totals.sum())
        slots = np.concatenate([t.sample(rng, int(k)) for t, k in zip(trees, counts, strict=True) if k]
                               or [np.empty(0, np.int64)])
        return rng.permutation(slots)
