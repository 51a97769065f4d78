"""What a sample is, computed from stored rows by index: transitions, n-step returns, sequences.

Everything here reads the row array through fancy indexes (one per field
needed) and the ring's chunk fills; nothing is copied ahead of time, so an
image is stored once and gathered only when a batch needs it.

A row t is a valid transition start when it is not final and its successor
link points at a stored row of the same episode with step index t+1 (a slot
overwritten since fails that check). The n-step target from t is

    R = sum_{i<k} gamma^i r_{t+i},   discount = gamma^k (0 if the episode
    terminated within those k rows),  o' = o_{t+k}

with k = n, or fewer where the episode ended earlier (termination: discount
0; truncation: bootstrap from the final observation) or where the successor
has not arrived yet (bootstrap from the last observation present).
"""

from __future__ import annotations

import numpy as np

from .layout import NEXT_GENERATION, NEXT_INDEX
from .ring import ChunkRing


def draw_stored(rng: np.random.Generator, ring: ChunkRing, n: int,
                chunk_weights: np.ndarray | None = None) -> np.ndarray:
    """``n`` slots, uniform over stored rows (or over chunks by ``chunk_weights``, then rows)."""
    fill = ring.fill
    if chunk_weights is None:
        cum = ring.cumulative_fill()
        total = int(cum[-1])
        if total <= 0:
            return np.empty(0, np.int64)
        u = rng.integers(0, total, n)
        chunk = np.searchsorted(cum, u, side="right")
        return u + (chunk * ring.chunk_rows - (cum[chunk] - fill[chunk]))
    cum = np.cumsum(chunk_weights)
    if cum[-1] <= 0:
        return np.empty(0, np.int64)
    chunk = np.minimum(np.searchsorted(cum, rng.random(n) * cum[-1], side="right"), len(fill) - 1)
    return chunk * ring.chunk_rows + (rng.random(n) * fill[chunk]).astype(np.int64)


def successor(rows: np.ndarray, ring: ChunkRing, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(successor slot, whether it is this row's true, stored successor) for each slot.

    The link holds while the successor's chunk keeps the generation it had
    when the link was made (an evicted or rewritten chunk gets a new one);
    final rows and rows awaiting their successor store -1. Reads only the
    rows at ``slots`` and the ring.
    """
    nxt = rows[NEXT_INDEX][slots]
    ok = ring.row_valid(nxt)
    safe = np.where(ok, nxt, slots)
    ok &= ring.generation[safe // ring.chunk_rows] == rows[NEXT_GENERATION][slots]
    return safe, ok


def n_step_return(rows: np.ndarray, ring: ChunkRing, start: np.ndarray, first_next: np.ndarray,
           gamma: float, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(return, discount, slot of o') for valid starts whose successors are ``first_next``."""
    terminated = rows["terminated"][start]
    ret = rows["reward"][start].astype(np.float32)
    discount = np.where(terminated, 0.0, gamma).astype(np.float32)
    end = first_next
    alive = ~terminated
    for k in range(1, n):
        if not alive.any():
            break
        nxt, ok = successor(rows, ring, end)
        extend = alive & ok
        reward, term = rows["reward"][end], rows["terminated"][end]
        ret += np.where(extend, np.float32(gamma ** k) * reward, np.float32(0))
        discount = np.where(extend, np.where(term, 0.0, gamma ** (k + 1)), discount).astype(np.float32)
        end = np.where(extend, nxt, end)
        alive = extend & ~term
    return ret, discount, end


def sequences(rows: np.ndarray, ring: ChunkRing, start: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(slots [B, length], ok [B]): ``length`` consecutive rows of one episode from each start."""
    slots = np.empty((len(start), length), np.int64)
    slots[:, 0] = start
    ok = ring.row_valid(start)
    for k in range(1, length):
        nxt, good = successor(rows, ring, slots[:, k - 1])
        ok &= good
        slots[:, k] = nxt
    return slots, ok
