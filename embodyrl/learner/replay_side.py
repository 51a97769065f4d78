"""The off-policy data side: rows into the persistent replay, batches out within a rate limit.

Rows go into ``run_dir/replay`` on disk (:class:`~embodyrl.replay.PersistentReplay`);
a group commit every ``learner.replay_commit_interval_s`` makes them
durable, and only then are they acknowledged: "acked" means "survives a
crash". A learner started on an existing run directory reopens the replay
and resumes each actor's sequence numbers from its last commit.

Credits carry the update-to-data ratio to the actors: rows are granted only
as fast as the samples-per-insert limiter lets the updates keep up (plus a
tolerance), so a simulator cannot outrun the learner and a slow one does not
stall it more than the ratio demands. A training call is K batches
(``learner.updates_per_call``), sampled ahead by a background thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import jax
import numpy as np

from ..config import LearnerConfig
from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import PolicyVersion, Steps
from ..replay import PersistentReplay, Prefetcher, RateLimiter
from ..transport.credits import grant_in_turn


class ReplayData:
    """``pad(device_id, steps)``: one device's rows in the replay's row layout (the run's
    :meth:`~embodyrl.hal.layout.Layout.pad_steps`; the identity for one device kind)."""

    def __init__(self, directory: Path, observation_spec: DictSpec, action_spec: ArraySpec,
                 config: LearnerConfig, *, batch_size: int, discount: float, seed: int,
                 pad: Callable[[int, Steps], Steps] = lambda device_id, steps: steps):
        self.config, self.batch_size, self.discount, self._pad = config, batch_size, discount, pad
        chunk = config.replay_chunk_rows
        capacity = max(2, -(-config.replay_capacity // chunk)) * chunk
        self.replay = PersistentReplay(directory, observation_spec, action_spec, capacity=capacity,
                                       chunk_rows=chunk, ram_budget_bytes=config.replay_ram_budget_mb << 20,
                                       write_behind_bytes=256 << 10)  # image batches: pwrite overlaps ingest
        # updates are samples, rows are inserts: the ratio and tolerance of LearnerConfig
        self.limiter = RateLimiter(config.updates_per_step, config.min_replay,
                                   config.updates_per_step * config.rate_tolerance)
        if self.replay.reopened:
            self.limiter.restore(self.replay.size)
        self._rng = np.random.default_rng(seed)
        self._prefetch: Prefetcher | None = None

    def committed_seq(self, actor_id: int) -> int:
        """The last seq of ``actor_id`` the replay holds (the transport dedupes from there)."""
        return self.replay.committed_seqs.get(actor_id, 0)

    def add(self, steps: Steps, seq: int, actor_id: int) -> int:
        self.replay.add(self._pad(int(steps.device_id[0]), steps), seq=seq)
        self.limiter.record_insert(len(steps))
        return 0

    def commit(self, final: bool = False) -> bool:
        if final:
            self.replay.commit()
            return True
        return self.replay.maybe_commit(self.config.replay_commit_interval_s)

    def durable(self) -> Mapping[int, int]:
        return self.replay.committed_seqs

    def grant_credits(self, server) -> None:
        grant_in_turn(server, self.config.credit_quantum, self.limiter.can_insert)

    def trainable(self) -> bool:
        return (self.replay.size >= self.config.min_replay
                and self.limiter.can_sample(self.config.updates_per_call))

    def _sample_call(self) -> dict:
        """One training call's K batches, stacked: numpy arrays ready for the device."""
        batches = [self.replay.sample(self._rng, self.batch_size, self.discount, self.config.n_step)
                   for _ in range(self.config.updates_per_call)]
        return jax.tree.map(lambda *xs: np.stack(xs), *batches)

    def batch(self) -> tuple[dict, dict]:
        if self.config.prefetch_batches == 0:
            return self._sample_call(), {}
        if self._prefetch is None:
            self._prefetch = Prefetcher(self._sample_call, depth=self.config.prefetch_batches)
        return self._prefetch.get(), {}

    def trained(self, updates: int) -> None:
        self.limiter.record_sample(updates)

    def published(self, version: PolicyVersion) -> int:
        return 0

    def restored(self, counters) -> None:
        self.limiter.samples = counters.updates  # the updates really made, not the ratio's guess

    def example_batch(self) -> None:
        return None  # compiled on the first real batch (sampling needs rows)

    def metrics(self) -> dict:
        return {"replay_size": self.replay.size, "replay_commits": self.replay.commits,
                "rows_awaiting_commit": self.replay.pending_rows}

    def close(self, failed: bool) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        self.replay.close(commit=not failed)  # after a failed commit as a crash would: the last one stands
