"""A deterministic step stream for replay tests: row g holds x = g, episodes of 10 steps + a final row."""

import numpy as np

from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import Steps

OBS = DictSpec.of(ArraySpec("x", (2,), np.float32))
ACT = ArraySpec("action", (1,), np.float32, -1, 1)
EPISODE = 11  # rows per episode, the last one final


def stream_rows(first: int, count: int, actor_id: int = 0, source: int = 0) -> Steps:
    g = np.arange(first, first + count, dtype=np.int64)
    step = (g % EPISODE).astype(np.int32)
    final = step == EPISODE - 1
    x = np.stack([g, -g], axis=1).astype(np.float32)
    return Steps(observation={"x": x}, action=np.where(final, 0, 0.5).astype(np.float32)[:, None],
                 proposed_action=np.zeros((count, 1), np.float32), log_prob=np.zeros(count, np.float32),
                 reward=(g % 5).astype(np.float32), terminated=(step == EPISODE - 2) & (g // EPISODE % 2 == 0),
                 truncated=(step == EPISODE - 2) & (g // EPISODE % 2 == 1), final=final,
                 episode_id=g // EPISODE + 1000 * actor_id, step_index=step,
                 device_id=np.zeros(count, np.int32), actor_id=np.full(count, actor_id, np.int32),
                 policy_incarnation=np.ones(count, np.int64), policy_count=np.zeros(count, np.int64),
                 source=np.where(final, 0, source).astype(np.uint8))


def stored_slots(replay) -> np.ndarray:
    """Stored slots, chunks in generation order (the order the ring wrote them)."""
    ring = replay.store.ring
    chunks = [c for c in np.argsort(ring.generation) if ring.generation[c] >= 0]
    parts = [np.arange(c * ring.chunk_rows, c * ring.chunk_rows + ring.fill[c]) for c in chunks]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def stored_in_order(replay) -> np.ndarray:
    """Stored x values in the order the ring wrote them."""
    return replay.store.rows["observation/x"][stored_slots(replay), 0]


def all_starts(replay) -> tuple[np.ndarray, np.ndarray]:
    """Every valid transition start and its successor, by exhaustive check."""
    from embodyrl.replay.sampling import successor

    ring = replay.store.ring
    slots = np.arange(replay.capacity)
    slots = slots[ring.row_valid(slots)]
    nxt, ok = successor(replay.store.rows, ring, slots)
    return slots[ok], nxt[ok]
