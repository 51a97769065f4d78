"""Replay of the step stream: the persistent, cache-aware buffer and its parts.

``PersistentReplay`` is the learner's default (rows durable on disk, group
commits, reopen without copying, n-step returns, sequences, per-source
mixing, priorities).
"""

from .limiter import RateLimiter
from .persistent import PersistentReplay
from .prefetch import Prefetcher
from .ring import ChunkRing, ReplayFullError

__all__ = ["ChunkRing", "PersistentReplay", "Prefetcher", "RateLimiter", "ReplayFullError"]
