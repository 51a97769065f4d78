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

What a batch holds is set by ``learner.mix`` (fractions by source; a side
that does not yet hold its share of a batch is left out, logged once),
``learner.priority`` (prioritised replay: importance weights in the batch,
the update's TD errors written back as priorities) and ``learner.demos``
(demonstrations loaded at start, once each: :meth:`ReplayData.load_demonstrations`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import jax
import numpy as np

from ..config import LearnerConfig
from ..hal import lerobot_demos
from ..hal.demos import demo_files, load_demonstrations, read_specs, spec_mismatch
from ..hal.specs import ArraySpec, DictSpec, SpecError
from ..hal.steps import PolicyVersion, Source, Steps
from ..replay import PersistentReplay, Prefetcher, RateLimiter
from ..replay.persistent import Group, group_name
from ..replay.persistent import _split as split_batch
from ..transport.credits import grant_in_turn

log = logging.getLogger(__name__)

DEMONSTRATION_ACTOR = -1
"""The actor id loaded demonstrations are stored under: their own stream, never an actor's. The
replay's committed seq of this id says which demonstration files a commit holds."""
DEMONSTRATION_SIDE: Group = (Source.DEMONSTRATION, Source.INTERVENTION)
LEDGER = "demonstrations.json"
"""In the replay's directory: every demonstration file loaded (name, path, sha256, steps, seq)."""
_KEYS = ("slot", "generation", "source", "probability")


def mix_groups(mix: Mapping[str, float] | None) -> dict[Group, float] | None:
    """``learner.mix`` as the replay's groups: ``demonstration`` draws interventions too, unless
    ``intervention`` has a fraction of its own."""
    if mix is None:
        return None
    groups = {}
    for name, fraction in mix.items():
        sources = {Source[name.upper()]}
        if name == "demonstration" and "intervention" not in mix:
            sources.add(Source.INTERVENTION)
        groups[tuple(sorted(int(s) for s in sources))] = fraction
    return groups


class RatioHeld:
    """What a replay-based data side does with its samples-per-insert limiter (``self.limiter``) once the
    rows are in: the updates owed, taken and restored, and the importance weights' exponent."""

    config: LearnerConfig
    limiter: RateLimiter
    _beta_updates: int | None

    @property
    def beta(self) -> float | None:
        """The importance weights' exponent now (None without priorities)."""
        return priority_beta(self.config, self.limiter.samples, self._beta_updates)

    def owed(self) -> int:
        """Gradient steps the rows taken still buy at ``learner.updates_per_step``."""
        return max(0, int(self.limiter.behind()))

    def trained(self, updates: int) -> None:
        self.limiter.record_sample(updates)

    def published(self, version: PolicyVersion) -> int:
        return 0

    def restored(self, counters) -> None:
        self.limiter.samples = counters.updates  # the updates really made, not the ratio's guess


class ReplayData(RatioHeld):
    """``pad(device_id, steps)``: one device's rows in the replay's row layout (the run's
    :meth:`~embodyrl.hal.layout.Layout.pad_steps`; the identity for one device kind).
    ``beta_updates``: gradient steps over which the importance weights' exponent anneals from
    ``learner.priority_beta`` to 1 (None: it stays there)."""

    def __init__(self, directory: Path, observation_spec: DictSpec, action_spec: ArraySpec,
                 config: LearnerConfig, *, batch_size: int, discount: float, seed: int,
                 pad: Callable[[int, Steps], Steps] = lambda device_id, steps: steps,
                 beta_updates: int | None = None):
        self.config, self.batch_size, self.discount, self._pad = config, batch_size, discount, pad
        chunk = config.replay_chunk_rows
        capacity = max(2, -(-config.replay_capacity // chunk)) * chunk
        self.replay = PersistentReplay(directory, observation_spec, action_spec, capacity=capacity,
                                       chunk_rows=chunk, ram_budget_bytes=config.replay_ram_budget_mb << 20,
                                       write_behind_bytes=256 << 10,  # image batches: pwrite overlaps ingest
                                       prioritized=config.priority, priority_exponent=config.priority_alpha)
        # updates are samples, rows are inserts: the ratio and tolerance of LearnerConfig
        self.limiter = RateLimiter(config.updates_per_step, config.min_replay,
                                   config.updates_per_step * config.rate_tolerance)
        if self.replay.reopened:  # demonstrations were never inserts: actors' rows only
            self.limiter.restore(self.replay.size - self.replay.group_rows((Source.DEMONSTRATION,)))
        self._rng = np.random.default_rng(seed)
        self._prefetch: Prefetcher | None = None
        self._mix = mix_groups(config.mix)
        self._beta_updates = beta_updates
        self._falling_back: bool | None = None  # the sampling thread's state, for logging its changes
        self.mix_fallback = False
        """Whether the last batch left a side of the mix out (it held less than its share)."""
        self._sampled = np.zeros(256, np.int64)  # rows drawn per source since the last metrics
        self.last_batch_keys: dict | None = None
        """The last batch's ``slot``, ``generation`` and ``source`` (``[K, batch]``; with priorities ``probability``)."""
        self._awaiting: dict | None = None  # the keys of a batch whose TD errors are due
        self._pending: tuple[dict, object] | None = None  # (keys, TD errors not yet written back)

    def committed_seq(self, actor_id: int) -> int:
        """The last seq of ``actor_id`` the replay holds (the transport dedupes from there)."""
        return self.replay.committed_seqs.get(actor_id, 0)

    # -- demonstrations --------------------------------------------------------------
    def load_demonstrations(self, directories: Sequence[str | Path],
                            kinds: Sequence[tuple[str, DictSpec, ArraySpec]],
                            features: Mapping[str, str] | None = None) -> dict:
        """Load every ``*.npz`` demonstration file of ``directories`` into the replay as
        ``source=DEMONSTRATION``, each file once: a file whose content (sha256) the replay
        already holds is skipped, so a resumed run does not duplicate it.

        ``kinds``: (name, observation spec, action spec) of the run's device kinds, device id
        = index. Every file is checked before any is loaded: one recorded with specs no kind
        has is refused (:class:`SpecError` naming the file and the field).

        The ledger (``demonstrations.json`` in the replay directory) lists each file with the
        seq its rows are added under (actor :data:`DEMONSTRATION_ACTOR`); it is written before
        the rows, and an entry counts only once a commit holds its seq, so a crash in between
        loads the file again instead of losing or doubling it. Returns counts for the log.
        """
        files = _demonstration_files(directories)
        plan = [(path, self._device_of(path, kinds, features)) for path in files]  # refused here, before any row
        ledger_path = self.replay.directory / LEDGER
        committed = self.committed_seq(DEMONSTRATION_ACTOR)
        ledger = [e for e in _read_ledger(ledger_path) if e["seq"] <= committed]
        held = {e["sha256"] for e in ledger}
        todo = []
        for path, device_id in plan:
            digest = _sha256(path)
            if digest not in held:
                held.add(digest)
                todo.append((path, device_id, digest))
        seq = max([committed, *(e["seq"] for e in ledger)])
        entries = []
        for path, device_id, digest in todo:
            seq += 1
            entries.append({"name": path.name, "path": str(path.resolve()), "sha256": digest, "seq": seq,
                            "device_id": device_id})
        steps = 0
        if entries:
            _write_ledger(ledger_path, ledger + entries)
            batch_rows = max(1, min(1024, self.config.replay_chunk_rows // 2))
            for entry, (path, device_id, _) in zip(entries, todo, strict=True):
                kind = kinds[device_id]
                if path.is_dir():  # a LeRobotDataset
                    batches = lerobot_demos.load(path, kind[1], kind[2], mapping=features, batch_rows=batch_rows,
                                                 actor_id=DEMONSTRATION_ACTOR, device_id=device_id)
                else:
                    batches = load_demonstrations(path, batch_rows=batch_rows, actor_id=DEMONSTRATION_ACTOR,
                                                  device_id=device_id, observation_spec=kind[1], action_spec=kind[2])
                for batch in batches:
                    self.replay.add(self._pad(device_id, batch), seq=entry["seq"])
                entry["steps"] = sum(len(b) for b in batches)
                steps += entry["steps"]
            self.replay.commit()
            _write_ledger(ledger_path, ledger + entries)  # with the step counts
        counts = {"files": len(files), "loaded": len(entries), "already_held": len(files) - len(entries),
                  "steps": steps}
        if files:
            log.info("demonstrations: %d files, %d loaded (%d steps), %d already in the replay",
                     counts["files"], counts["loaded"], steps, counts["already_held"])
        return counts

    @staticmethod
    def _device_of(path: Path, kinds, features: Mapping[str, str] | None = None) -> int:
        """The device id (kind index) whose specs ``path`` was recorded with (a LeRobotDataset: whose
        fields its features fit), or SpecError."""
        recorded = None if path.is_dir() else read_specs(path)
        reasons = []
        for device_id, (name, kind_observation, kind_action) in enumerate(kinds):
            if recorded is None:
                reason = lerobot_demos.check(path, kind_observation, kind_action, features)
            else:
                reason = spec_mismatch(*recorded, kind_observation, kind_action)
            if reason is None:
                return device_id
            reasons.append(reason if len(kinds) == 1 else f"device kind {name!r}: {reason}")
        raise SpecError(f"{path}: " + "; ".join(reasons))

    # -- ingest ----------------------------------------------------------------------
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

    # -- batches ---------------------------------------------------------------------
    def trainable(self) -> bool:
        return (self.replay.size >= self.config.min_replay
                and self.limiter.can_sample(self.config.updates_per_call))

    def _mix_now(self) -> dict[Group, float] | None:
        """The mix without the sides that hold less than their share of a batch (None: uniform)."""
        if self._mix is None:
            return None
        shares = split_batch(self.batch_size, self._mix)
        ready = {g: f for g, f in self._mix.items()
                 if f > 0 and self.replay.group_rows(g) >= max(shares[g], 1)}
        falling_back = len(ready) < sum(1 for f in self._mix.values() if f > 0)
        if falling_back != self._falling_back:
            if falling_back:
                short = [f"{group_name(g)} holds {self.replay.group_rows(g)} of the {shares[g]} steps of its "
                         f"share" for g in self._mix if g not in ready and self._mix[g] > 0]
                log.warning("learner.mix: %s; sampling %s until it does", ", ".join(short),
                            " and ".join(group_name(g) for g in ready) + " only" if ready else "uniformly")
            elif self._falling_back is not None:
                log.info("learner.mix: every side holds its share of a batch; sampling %s",
                         ", ".join(f"{group_name(g)} {f:g}" for g, f in self._mix.items()))
            self._falling_back = falling_back
        return (ready or None) if falling_back else self._mix

    def _sample_call(self) -> tuple[dict, dict]:
        """One training call's K batches, stacked (numpy arrays ready for the device), and
        their keys (slots, generations, sources) with whether the mix fell back."""
        mix, beta = self._mix_now(), self.beta
        calls, size = self.config.updates_per_call, self.batch_size
        if mix is None and beta is None:
            # K independent uniform batches are K x B independent draws: one draw, cut in K (a mix's
            # fractions and importance weights' normalisation hold per batch, so those draw K times)
            drawn = self.replay.sample(self._rng, calls * size, self.discount, self.config.n_step, keys=True)
            stacked = jax.tree.map(lambda x: x.reshape(calls, size, *x.shape[1:]), drawn)
        else:
            batches = [self.replay.sample(self._rng, size, self.discount, self.config.n_step,
                                          mix=mix, keys=True, importance=beta) for _ in range(calls)]
            stacked = jax.tree.map(lambda *xs: np.stack(xs), *batches)
        keys = {k: stacked.pop(k) for k in _KEYS if k in stacked}
        keys["fallback"] = self._mix is not None and mix is not self._mix
        return stacked, keys

    def batch(self) -> tuple[dict, dict]:
        self._write_priorities()
        if self.config.prefetch_batches == 0:
            batch, keys = self._sample_call()
        else:
            if self._prefetch is None:
                self._prefetch = Prefetcher(self._sample_call, depth=self.config.prefetch_batches)
            batch, keys = self._prefetch.get()
        self.mix_fallback = keys.pop("fallback")
        self._sampled += np.bincount(keys["source"].reshape(-1), minlength=256)
        self.last_batch_keys = self._awaiting = keys
        return batch, {}

    def reprioritise(self, td_error) -> None:
        """The last batch's TD errors (``[K, batch]``, from the update): its rows' new priorities,
        written back when the next batch is taken (the update has finished by then)."""
        if self._awaiting is not None:
            self._pending, self._awaiting = (self._awaiting, td_error), None

    def _write_priorities(self) -> None:
        if self._pending is None:
            return
        keys, td_error = self._pending
        self._pending = None
        self.replay.update_priorities(keys["slot"].reshape(-1), keys["generation"].reshape(-1),
                                      np.asarray(td_error, np.float64).reshape(-1))


    def example_batch(self) -> None:
        return None  # compiled on the first real batch (sampling needs rows)

    def metrics(self) -> dict:
        sampled, self._sampled = self._sampled, np.zeros_like(self._sampled)
        total = int(sampled.sum())
        record = {"replay_size": self.replay.size, "replay_commits": self.replay.commits,
                  "updates_behind": round(self.limiter.behind(), 1),
                  "rows_awaiting_commit": self.replay.pending_rows,
                  "replay_demonstration_steps": self.replay.group_rows(DEMONSTRATION_SIDE),
                  "replay_by_source": {source.name.lower(): self.replay.group_rows((source,)) for source in Source},
                  "sampled_demo_fraction": float(sampled[list(DEMONSTRATION_SIDE)].sum() / total) if total else None,
                  "sampled_intervention_fraction": float(sampled[Source.INTERVENTION] / total) if total else None}
        if self._mix is not None:
            record["mix_fallback"] = self.mix_fallback
        if self.config.priority:
            record["priority_beta"] = round(self.beta, 4)
        return record

    def close(self, failed: bool) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        self.replay.close(commit=not failed)  # after a failed commit as a crash would: the last one stands


def priority_beta(config: LearnerConfig, updates: int, beta_updates: int | None) -> float | None:
    """The importance weights' exponent after ``updates`` gradient steps: ``learner.priority_beta``
    annealed linearly to 1 over ``beta_updates`` (None: it stays there; None without priorities)."""
    if not config.priority:
        return None
    start = config.priority_beta
    if not beta_updates:
        return start
    return start + (1.0 - start) * min(1.0, updates / beta_updates)


def _demonstration_files(directories: Sequence[str | Path]) -> list[Path]:
    try:
        return demo_files(directories, datasets=True)
    except ValueError as err:
        raise ValueError(f"learner.demos: {err}") from None


def _sha256(path: Path) -> str:
    if path.is_dir():  # a LeRobotDataset: its files' names and bytes
        return lerobot_demos.content_hash(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_ledger(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text())["files"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a readable demonstration ledger ({err})") from None


def _write_ledger(path: Path, entries: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"files": entries}, indent=1) + "\n")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
