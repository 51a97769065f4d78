"""The learner's data side over its ingest workers' replay shards (:mod:`.ingest`): the ratio, the
budget's credit and the training batches are the learner's, the rows the workers'.

Every training call's batch comes from every shard in proportion to the rows it holds (largest
remainder), asked ahead (``learner.prefetch_batches`` calls in flight). With priorities each shard
draws by priority within itself, and the importance weights are worked out over the whole batch:
shard s (N_s rows) brings about B N_s / N rows, each drawn with P(row | s), so P(row) = N_s / N P(row | s)
and Schaul et al.'s w = (N P(row))^-beta = (N_s P(row | s))^-beta, over the batch's largest.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Mapping

import numpy as np

from ..hal import params as flat_params
from ..hal.steps import Source
from ..replay import RateLimiter
from ..replay.persistent import _split as split_rows
from .ingest import LIMIT, PRIORITIES, SAMPLE, IngestWorkers, Taken
from .replay_side import RatioHeld

BATCH_TIMEOUT_S = 60.0
HEADROOM_QUANTA = 4
"""Quanta per session a worker's cap may run ahead of the credit its actors hold: it grants again as
soon as a session spends one, while its report and the learner's new cap cross (a cap of one quantum
a session would make every grant wait for that round trip)."""


class ShardedReplay(RatioHeld):
    """The off-policy data side over ingest workers' shards (a :class:`~.service.DataSide`): the
    limiter, the budget's credit and the batches are the learner's, the rows the workers'."""

    def __init__(self, workers: IngestWorkers, config, *, batch_size: int, batch_rows: int,
                 beta_updates: int | None = None):
        self.workers, self.config, self.batch_size = workers, config, batch_size
        self.batch_rows = batch_rows
        self._beta_updates = beta_updates
        self.limiter = RateLimiter(config.updates_per_step, config.min_replay,
                                   config.updates_per_step * config.rate_tolerance)
        self._calls = itertools.count(1)
        self._inflight: collections.deque = collections.deque()  # (call, {shard: rows}, beta)
        self._awaiting: tuple | None = None  # (parts, keys) of the batch whose TD errors are due
        self._pending: tuple | None = None  # (parts, keys, TD errors) not yet sent back
        self._sampled = np.zeros(256, np.int64)
        self.last_batch_keys: dict | None = None
        self._offered: dict[int, int] = {}  # shard -> number of the last quantum it was offered
        self._offers = itertools.count()

    # -- ingest: the workers' -----------------------------------------------------------------------
    def add(self, steps, seq: int, actor_id: int) -> int:
        raise RuntimeError("the learner's own port takes no steps with ingest workers")

    def commit(self, final: bool = False) -> bool:
        return False  # each worker commits and acknowledges its own shard

    def durable(self) -> Mapping[int, int]:
        return {}

    def taken_elsewhere(self) -> Taken:
        """What the workers took since the last look (the service counts it as its own)."""
        return self.workers.take()

    def grant_credits(self, granting) -> None:
        """Each worker's cap: the rows its actors took, the credit they hold, and quanta of what the
        limiter (and the budget) still admit, offered first to the worker holding least per session (the
        last of the budget in a part quantum, as :class:`~.service.WithinBudget` cuts a grant)."""
        every = self.workers.workers  # a worker starting again keeps its last report's rows meanwhile
        self.limiter.inserts = sum(w.inserted for w in every)
        outstanding = sum(w.outstanding for w in every)
        free = self.limiter.insert_room() - outstanding
        room = getattr(granting, "room", None)  # a step budget (:class:`~.service.WithinBudget`)
        if room is not None:
            free = min(free, room - outstanding)
        workers = self.workers.ready
        quantum = self.config.credit_quantum
        extra = dict.fromkeys(range(len(workers)), 0)
        wanting = [i for i, w in enumerate(workers) if w.sessions]
        while wanting and free > 0:  # least held per session first, then the one served longest ago
            i = min(wanting, key=lambda i: ((workers[i].outstanding + extra[i]) / workers[i].sessions,
                                            self._offered.get(workers[i].shard, -1)))
            if workers[i].outstanding + extra[i] >= HEADROOM_QUANTA * quantum * workers[i].sessions:
                break  # every worker may grant each of its sessions a few quanta without asking again
            offer = min(quantum, free)
            extra[i] += offer
            free -= offer
            self._offered[workers[i].shard] = next(self._offers)
        for i, worker in enumerate(workers):
            cap = worker.inserted + worker.outstanding + extra[i]
            if cap != worker.cap and self.workers.send(worker, LIMIT, {"cap": cap}):
                worker.cap = cap

    # -- batches -------------------------------------------------------------------------------------
    def trainable(self) -> bool:
        workers = self.workers.ready
        return (len(workers) == self.workers.count and sum(w.size for w in workers) >= self.config.min_replay
                and self.limiter.can_sample(self.config.updates_per_call))

    def _request(self) -> None:
        """Ask every shard for its share of one training call, in proportion to the rows it holds."""
        sizes = {w.shard: w.size for w in self.workers.ready if w.size > 0}
        parts = {s: n for s, n in split_rows(self.batch_size, sizes).items() if n > 0}
        call, beta = next(self._calls), self.beta
        for shard, rows in parts.items():
            self.workers.send(self.workers.workers[shard], SAMPLE,
                              {"call": call, "rows": rows, "calls": self.config.updates_per_call,
                               "priorities": beta is not None})
        starts = {shard: self.workers.workers[shard].starts for shard in parts}
        self._inflight.append((call, parts, beta, starts))

    def _collect(self, call: int, parts: dict[int, int], starts: dict[int, int],
                 deadline: float) -> list[tuple[int, dict, dict]] | None:
        """The call's parts from every shard, in shard order (None: a worker asked was started again)."""
        batches, workers = self.workers.batches, self.workers.workers
        while not all((call, s) in batches for s in parts):
            self.workers.supervise()
            if any(not workers[s].ready or workers[s].starts != starts[s] for s in parts):
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no batch from ingest workers {[s for s in parts if (call, s) not in batches]} "
                                   f"within {BATCH_TIMEOUT_S:g} s")
            self.workers.pump(5)
        return [(s, *batches.pop((call, s))) for s in sorted(parts)]

    def _wait_ready(self, deadline: float) -> None:
        """Until every worker is ready (one started again, say) and some hold rows to sample."""
        workers = self.workers.workers
        while not (all(w.ready for w in workers) and any(w.size > 0 for w in workers)):
            self.workers.supervise()
            if time.monotonic() > deadline:
                raise TimeoutError("ingest workers not ready to sample within "
                                   f"{BATCH_TIMEOUT_S:g} s: {self.workers.describe()}")
            self.workers.pump(20)

    def batch(self) -> tuple[dict, dict]:
        self._send_priorities()
        depth = max(1, self.config.prefetch_batches)
        deadline = time.monotonic() + BATCH_TIMEOUT_S
        while True:
            self._wait_ready(deadline)
            while len(self._inflight) < depth:
                self._request()
            call, parts, beta, starts = self._inflight.popleft()
            got = self._collect(call, parts, starts, deadline)
            if got is not None:
                break
            self._inflight.clear()  # a worker started again: what it was asked is lost, so is the rest
        self._request()
        oldest = self._inflight[0][0]
        for key in [k for k in self.workers.batches if k[0] < oldest]:  # parts of calls given up
            del self.workers.batches[key]
        batch, keys = self._assemble(got, beta)
        self._sampled += np.bincount(keys["source"].reshape(-1), minlength=256)
        self.last_batch_keys = keys
        self._awaiting = ([(s, int(f["rows"])) for s, f, _ in got], keys)
        return batch, {}

    @staticmethod
    def _assemble(got, beta: float | None) -> tuple[dict, dict]:
        """One batch of the shards' parts, each ``[calls, rows, ...]``, joined along the rows; with
        priorities, the importance weights over the whole batch."""
        trees = [flat_params.unflatten({k: v for k, v in arrays.items() if not k.startswith("keys/")})
                 for _, _, arrays in got]
        batch = _concatenate(trees)
        keys = {name: np.concatenate([arrays[f"keys/{name}"] for _, _, arrays in got], axis=1)
                for name in ("slot", "generation", "source", "probability") if f"keys/{name}" in got[0][2]}
        if beta is not None:  # w = (N_shard P(row | shard))^-beta, over the batch's largest
            scale = np.concatenate([np.full(arrays["keys/probability"].shape, float(f["stored"]))
                                    for _, f, arrays in got], axis=1)
            w = (scale * np.maximum(keys["probability"], 1e-300)) ** -beta
            batch["weight"] = (w / w.max(axis=1, keepdims=True)).astype(np.float32)
        return batch, keys

    def reprioritise(self, td_error) -> None:
        if self._awaiting is not None:
            self._pending, self._awaiting = (*self._awaiting, td_error), None

    def _send_priorities(self) -> None:
        if self._pending is None:
            return
        parts, keys, td_error = self._pending
        self._pending = None
        td = np.asarray(td_error, np.float64)
        start = 0
        for shard, rows in parts:
            cut = slice(start, start + rows)
            start += rows
            self.workers.send(self.workers.workers[shard], PRIORITIES, {}, {
                "slot": np.ascontiguousarray(keys["slot"][:, cut]).reshape(-1),
                "generation": np.ascontiguousarray(keys["generation"][:, cut]).reshape(-1),
                "td_error": np.ascontiguousarray(td[:, cut]).reshape(-1)})

    def example_batch(self) -> None:
        return None

    def metrics(self) -> dict:
        sampled, self._sampled = self._sampled, np.zeros_like(self._sampled)
        total = int(sampled.sum())
        workers = self.workers.workers
        by_source = {source.name.lower(): sum(int(w.status.get("by_source", {}).get(source.name.lower(), 0))
                                              for w in workers) for source in Source}
        record = {"replay_size": sum(w.size for w in workers),
                  "replay_commits": sum(int(w.status.get("commits", 0)) for w in workers),
                  "updates_behind": round(self.limiter.behind(), 1),
                  "rows_awaiting_commit": sum(int(w.status.get("pending", 0)) for w in workers),
                  "replay_demonstration_steps": 0, "replay_by_source": by_source,
                  "replay_shards": [w.size for w in workers], "ingest_worker_restarts": self.workers.restarts,
                  "sampled_demo_fraction": 0.0 if total else None,
                  "sampled_intervention_fraction": float(sampled[Source.INTERVENTION] / total) if total else None}
        if self.config.priority:
            record["priority_beta"] = round(self.beta, 4)
        return record

    def close(self, failed: bool) -> None:
        self.workers.close()


def _concatenate(trees: list):
    """Join batch trees along their rows (axis 1: ``[calls, rows, ...]``)."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: _concatenate([t[k] for t in trees]) for k in first}
    return np.concatenate(trees, axis=1)
