"""The persistent, cache-aware replay: durable rows on disk, batches by index.

Wraps a :class:`ChunkStore` (durable rows, group commits, reopen), a
:class:`CachePolicy` (the RAM budget) and, optionally, a :class:`SumTree`
(proportional priorities), and serves:

* ``sample``: transitions with n-step returns, uniform over valid starts (or
  per-source mixing in set proportions, a key naming one source or a group of
  them, or by priority, with importance weights), optionally only rows acted
  by a recent policy (``max_staleness``);
* ``sample_sequences``: fixed-length runs of one episode's rows (experimental: no learner uses it yet).

Uniform means i.i.d. uniform over stored rows, rejecting those that are not
valid transition starts (final rows, rows whose successor has not arrived or
was overwritten); see docs/replay.md for exactly how each mode differs.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import OBSERVATION_PREFIX, PolicyVersion, Source, Steps
from .cache import CachePolicy
from .layout import Layout
from .pages import keep_freed_heap
from .sampling import draw_stored, n_step_return, sequences, successor
from .store import ChunkStore
from .sumtree import SourceTrees

_MAX_ROUNDS = 64

def candidates(need: int, rate: float) -> int:
    """Rows to draw for ``need`` valid ones where a fraction ``rate`` is valid: the expected count and
    four standard deviations, so a second round is rare (cold, each candidate is a read)."""
    expected = need / rate
    return int(expected + 4 * np.sqrt(expected * (1 - rate)) + 2)


Group = tuple[int, ...]
"""Sources drawn together as one part of a mix (the demonstration side: demonstrations and
interventions)."""


def as_group(source: int | tuple[int, ...]) -> Group:
    """A mix key (one source or several) as a sorted tuple of sources."""
    return tuple(sorted({int(s) for s in (source if isinstance(source, tuple) else (source,))}))


def group_name(group: Group) -> str:
    return "/".join(Source(s).name for s in group)


class PersistentReplay:
    def __init__(self, directory: Path, observation_spec: DictSpec | None = None,
                 action_spec: ArraySpec | None = None, *, capacity: int = 1 << 20, chunk_rows: int = 4096,
                 ram_budget_bytes: int = 256 << 20, retained: tuple[int, ...] = (Source.DEMONSTRATION,),
                 prioritized: bool = False, priority_exponent: float = 0.6, release_every: int = 64,
                 write_behind_bytes: int | None = None):
        """Open the replay in ``directory``, creating it from the specs if it holds none.

        ``write_behind_bytes``: batches at least this large are written by a writer thread
        while ``add`` returns (see writer.py); their image columns are written from the
        caller's arrays, which must then stay unchanged until ``wait_for_writes`` or a
        commit (received frames never change). None: every write on the caller's thread."""
        layout = None
        if observation_spec is not None and action_spec is not None:
            layout = Layout(capacity, chunk_rows, observation_spec, action_spec)
        self.reopened = (Path(directory) / "meta.json").exists()
        self.store = ChunkStore(Path(directory), layout, retained=retained,
                                write_behind_bytes=write_behind_bytes)
        self.observation_spec = self.store.layout.observation_spec
        self.action_spec = self.store.layout.action_spec
        self.capacity = self.store.layout.capacity
        self.cache = CachePolicy(self.store, ram_budget_bytes, release_every)
        self.lock = threading.RLock()
        self.priorities = SourceTrees(self.capacity) if prioritized else None
        self.priority_exponent = priority_exponent
        self._max_priority = 1.0
        if self.priorities is not None:
            self._reprioritise_stored()
        self._obs_names = [OBSERVATION_PREFIX + k for k in self.observation_spec]
        self._durable_seen = self.store.durable_commits
        self._acceptance: dict = {}  # (source, max_staleness) -> the share of drawn rows that were valid
        if self.store.has_direct_fields:
            keep_freed_heap()

    def _reprioritise_stored(self) -> None:
        """Priorities are not persisted: stored rows restart at the max priority (1), each in its
        source's tree. A chunk of one source is assigned from the ring's counts; only chunks
        mixing sources (e.g. interventions among online rows) have their source column read."""
        ring, rows = self.store.ring, self.store.rows
        for c in np.flatnonzero(ring.fill):
            first, fill = int(c) * ring.chunk_rows, int(ring.fill[c])
            slots = np.arange(first, first + fill)
            present = np.flatnonzero(ring.source_rows[c])
            sources = (np.full(fill, present[0]) if len(present) == 1 else rows["source"][first:first + fill])
            self.priorities.set(slots, sources, np.ones(fill))

    # -- state -------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return self.store.directory

    @property
    def size(self) -> int:
        return self.store.ring.size

    @property
    def rows_added(self) -> int:
        return self.store.rows_added

    @property
    def committed_seqs(self) -> dict[int, int]:
        """actor id -> the last wire sequence number whose rows are durable."""
        return dict(self.store.committed_seqs)

    @property
    def pending_rows(self) -> int:
        """Rows added since the last commit began (not yet on their way to disk)."""
        return self.store.pending_rows

    @property
    def commits(self) -> int:
        """Commits known durable."""
        return self.store.durable_commits

    # -- writing ---------------------------------------------------------------
    def add(self, steps: Steps, seq: int | None = None) -> np.ndarray:
        """Append one stream's consecutive rows (durable at the next commit); returns slots."""
        with self.lock:
            slots = self.store.add(steps, seq, on_evict=self._evicted)
            if self.priorities is not None:
                self.priorities.set(slots, steps.source, np.where(steps.final, 0.0, self._max_priority))
            self.cache.refresh()
            return slots

    def _evicted(self, chunk: int) -> None:
        if self.priorities is not None:
            rows = self.store.layout.chunk_rows
            self.priorities.clear(chunk * rows, rows)

    def wait_for_writes(self) -> None:
        """Return once every row added so far is in the page cache (the writer thread's queue
        drained); raise a failed write's error."""
        self.store.drain_writes()

    def commit(self) -> None:
        """Make every row added so far durable now (waits for a background commit first)."""
        with self.lock:
            self.store.commit()

    def maybe_commit(self, interval_s: float) -> bool:
        """Start a group commit in the background if rows have waited ``interval_s`` or fill a
        chunk; True if ``committed_seqs`` advanced since the last call (time to acknowledge).

        Returns at once: the syncs run on the store's committer thread, and
        ``committed_seqs`` moves only when they have returned. A failed
        background commit raises here, at the next call; a failed row write
        (:class:`~.writer.RowsLost`) at this and every later call.
        """
        with self.lock:
            self.store.check()  # a lost row write: raised here too, at every call
            if not self.store.committing:
                self.store.settle()  # a finished commit's error surfaces here
                if self.store.commit_due(interval_s):
                    self.store.commit_in_background()
            durable = self.store.durable_commits
            advanced, self._durable_seen = durable != self._durable_seen, durable
            return advanced

    def close(self, commit: bool = True) -> None:
        """Commit pending rows (unless ``commit`` is False, as a crash would) and unmap."""
        with self.lock:
            self.store.close(commit)

    # -- drawing valid starts ----------------------------------------------------
    def group_rows(self, group: Group) -> int:
        """Stored rows of ``group``'s sources (final rows included)."""
        with self.lock:
            return int(self.store.ring.source_rows[:, list(group)].sum())

    def _draw(self, rng, n: int, source: Group | None, max_staleness: int | None,
              latest: PolicyVersion | None, hot_weight: float | None,
              chunk_weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        ring, rows = self.store.ring, self.store.rows
        if max_staleness is not None and latest is None:
            raise ValueError("max_staleness needs latest, the newest policy version")
        weights = chunk_weights
        if source is not None:
            weights = ring.source_rows[:, list(source)].sum(axis=1).astype(np.float64)
            if weights.sum() == 0:
                raise RuntimeError(f"replay holds no rows of source {group_name(source)}")
        elif hot_weight is not None:
            weights = self.cache.chunk_weights(hot_weight)
        starts, nexts = [], []
        kind = (source, max_staleness)
        need, rate = n, self._acceptance.get(kind, 1.0)
        prioritized = self.priorities is not None
        if not self.cache.all_hot:
            self.cache.release_due()  # before this sample's hints, not after them
        for round_ in range(_MAX_ROUNDS):
            m = candidates(need, rate)
            cand = self.priorities.sample(rng, m, source) if prioritized else draw_stored(rng, ring, m, weights)
            if not self.cache.all_hot:
                absent = self.cache.to_hint(cand)
                if absent.any():
                    self.store.will_need(cand[absent])
                    self.cache.touched(cand)
            nxt, ok = successor(rows, ring, cand)
            if prioritized:  # a draw may land on an evicted or final row: never valid again
                stored = ring.row_valid(cand)
                ok &= stored
                dead = ~stored | rows["final"][np.where(stored, cand, 0)]
                self.priorities.set(cand[dead], rows["source"][cand[dead]], 0.0)
            if source is not None:
                ok &= np.isin(rows["source"][cand], source)
            if max_staleness is not None:
                ok &= rows["policy_incarnation"][cand] == latest.incarnation
                ok &= latest.count - rows["policy_count"][cand] <= max_staleness
            good = np.flatnonzero(ok)
            rate = max(len(good) / m, 0.02)
            if round_ == 0:  # what the next sample of this kind expects (every candidate is hinted and read)
                self._acceptance[kind] = 0.9 * self._acceptance.get(kind, rate) + 0.1 * rate
            if len(good) >= need and not starts:
                good = good[:need]
                return cand[good], nxt[good]
            good = good[:need]
            starts.append(cand[good])
            nexts.append(nxt[good])
            need -= len(good)
            if need == 0:
                return np.concatenate(starts), np.concatenate(nexts)
        raise RuntimeError(f"replay of {self.size} rows has too few complete transitions to sample "
                           f"(source={source}, max_staleness={max_staleness})")

    def sample_indices(self, rng: np.random.Generator, batch_size: int, *,
                       mix: dict[int, float] | None = None, max_staleness: int | None = None,
                       latest: PolicyVersion | None = None, hot_weight: float | None = None,
                       chunk_weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(start slots, successor slots) of ``batch_size`` valid transitions."""
        idx, nxt, _ = self._indices(rng, batch_size, mix, max_staleness, latest, hot_weight, chunk_weights)
        return idx, nxt

    def _indices(self, rng, batch_size, mix, max_staleness, latest, hot_weight, chunk_weights):
        """(starts, successors, [(group, rows of the batch drawn from it)]); group None: all sources."""
        if mix is None:
            idx, nxt = self._draw(rng, batch_size, None, max_staleness, latest, hot_weight, chunk_weights)
            return idx, nxt, [(None, batch_size)]
        counts = {as_group(s): k for s, k in _split(batch_size, mix).items() if k}
        parts = [self._draw(rng, k, g, max_staleness, latest, None) for g, k in counts.items()]
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                list(counts.items()))

    def _importance(self, idx: np.ndarray, parts, beta: float | None) -> tuple[np.ndarray, np.ndarray | None]:
        """(P(row) within the group it was drawn from, importance weights or None): Schaul et
        al.'s w = (N P(row))^-beta over the max in the batch, N the group's stored rows. The
        target is uniform within each group, so a mixed batch keeps its fractions."""
        rows, ring = self.store.rows, self.store.ring
        p = self.priorities.get(idx, rows["source"][idx])
        probability, n_rows = np.empty(len(idx)), np.empty(len(idx))
        start = 0
        for group, k in parts:
            part = slice(start, start + k)
            probability[part] = p[part] / max(self.priorities.total(group), 1e-300)
            n_rows[part] = ring.size if group is None else ring.source_rows[:, list(group)].sum()
            start += k
        if beta is None:
            return probability, None
        w = (n_rows * np.maximum(probability, 1e-300)) ** -beta
        return probability, (w / w.max()).astype(np.float32)

    # -- batches -----------------------------------------------------------------
    def sample(self, rng: np.random.Generator, batch_size: int, discount: float, n_step: int = 1, *,
               mix: dict[int, float] | None = None, max_staleness: int | None = None,
               latest: PolicyVersion | None = None, hot_weight: float | None = None,
               chunk_weights: np.ndarray | None = None, keys: bool = False,
               importance: float | None = None) -> dict:
        """Transitions: o, a, n-step return, discount (gamma^k, 0 after termination), o'.

        ``mix`` maps sources to batch fractions (e.g. {DEMONSTRATION: .5,
        ONLINE: .5}; a key may be a tuple of sources drawn as one group, e.g.
        {(DEMONSTRATION, INTERVENTION): .5, ONLINE: .5}); ``max_staleness`` keeps rows acted by ``latest`` or at
        most that many publications before it; ``hot_weight`` > 1 prefers
        chunks in the RAM budget (not uniform: see ``cache.tv_from_uniform``);
        ``chunk_weights`` draws chunks by weight, then rows uniformly (see staged.py).
        ``keys`` adds ``slot``, ``generation`` (for priority updates) and ``source``, and
        with priorities ``probability`` (within the row's mix group). ``importance`` (beta; with
        priorities) adds ``weight``, the importance weights (see :meth:`_importance`).
        """
        if n_step < 1:
            raise ValueError(f"n_step must be at least 1, got {n_step}")
        with self.lock:
            idx, nxt, parts = self._indices(rng, batch_size, mix, max_staleness, latest, hot_weight,
                                            chunk_weights)
            rows, ring = self.store.rows, self.store.ring
            if n_step == 1:
                reward = rows["reward"][idx]
                disc = np.where(rows["terminated"][idx], 0.0, discount).astype(np.float32)
                end = nxt
            else:
                reward, disc, end = n_step_return(rows, ring, idx, nxt, discount, n_step)
            batch = {
                "observation": {k[len(OBSERVATION_PREFIX):]: rows[k][idx] for k in self._obs_names},
                "action": rows["action"][idx].astype(np.float32, copy=False),
                "reward": reward,
                "discount": disc,
                "next_observation": {k[len(OBSERVATION_PREFIX):]: rows[k][end] for k in self._obs_names},
            }
            if self.priorities is not None and (keys or importance is not None):
                probability, weight = self._importance(idx, parts, importance)
                if weight is not None:
                    batch["weight"] = weight
                if keys:
                    batch["probability"] = probability
            if keys:
                batch["slot"] = idx
                batch["generation"] = ring.generation[idx // ring.chunk_rows]
                batch["source"] = rows["source"][idx]
            return batch

    def sample_sequences(self, rng: np.random.Generator, batch_size: int, length: int) -> dict:
        """``batch_size`` runs of ``length`` consecutive rows of one episode each ([B, L, ...]).

        Experimental: for recurrent or sequence models, which no registered algorithm is yet;
        tested, but no learner or config setting calls it.

        Starts are uniform over stored rows, rejecting those whose episode
        has fewer than ``length`` rows from there (a final row may end a run).
        """
        with self.lock:
            rows, ring = self.store.rows, self.store.ring
            chosen, need = [], batch_size
            for _ in range(_MAX_ROUNDS):
                slots, ok = sequences(rows, ring, draw_stored(rng, ring, 2 * need + 8), length)
                chosen.append(slots[ok][:need])
                need -= len(chosen[-1])
                if need == 0:
                    slots = np.concatenate(chosen)
                    out = {name: rows[name][slots] for name in (
                        "action", "reward", "terminated", "truncated", "final", "log_prob",
                        "policy_incarnation", "policy_count", "source", "episode_id", "step_index")}
                    out["observation"] = {k[len(OBSERVATION_PREFIX):]: rows[k][slots] for k in self._obs_names}
                    return out
            raise RuntimeError(f"replay of {self.size} rows has too few runs of {length} rows to sample")

    # -- priorities ----------------------------------------------------------------
    def update_priorities(self, slots: np.ndarray, generations: np.ndarray, priorities: np.ndarray) -> int:
        """Set priorities (|TD error|) of sampled rows; rows overwritten since are ignored.

        Returns how many were applied.
        """
        if self.priorities is None:
            raise RuntimeError("this replay was opened without prioritized=True")
        with self.lock:
            ring = self.store.ring
            slots = np.asarray(slots, np.int64)
            live = ring.generation[slots // ring.chunk_rows] == np.asarray(generations)
            live &= ring.row_valid(slots)
            p = (np.abs(np.asarray(priorities, np.float64)[live]) + 1e-6) ** self.priority_exponent
            self.priorities.set(slots[live], self.store.rows["source"][slots[live]], p)
            if len(p):
                self._max_priority = max(self._max_priority, float(p.max()))
            return int(live.sum())

    def drop_page_cache(self) -> None:
        """Evict the data file from the page cache (cold-read benchmarks)."""
        with self.lock:
            self.store.drop_page_cache()
            self.cache.forget_resident()



def _split(batch_size: int, mix: dict) -> dict:
    """Batch rows per source for fractions ``mix`` (largest remainder, exact total)."""
    total = sum(mix.values())
    if total <= 0 or any(f < 0 for f in mix.values()):
        raise ValueError(f"mix fractions must be non-negative with a positive sum, got {mix}")
    exact = {s: batch_size * f / total for s, f in mix.items()}
    counts = {s: int(v) for s, v in exact.items()}
    for s in sorted(exact, key=lambda s: counts[s] - exact[s])[:batch_size - sum(counts.values())]:
        counts[s] += 1
    return counts
