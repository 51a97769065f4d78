"""Cut actors' step streams into PPO's time-major rollout segments, and drop data too stale to use.

Actors stream steps (one row per control step, plus a ``final`` row that
closes each episode; see :mod:`embodyrl.hal.steps`). PPO wants segments of T
consecutive transitions of one stream, each with the behaviour
log-probability and the policy version that acted. Per (actor, device)
stream this keeps the row waiting for its successor and the segment being
built; a transition is complete once the next row (its o_t+1) arrives.

Staleness is counted in publications: a transition acted by version count
c is ``current - c`` iterations old. A transition older than
``max_staleness`` (or of another learner incarnation, or taken before any
weights arrived) is discarded together with the segment built so far:
versions only grow along a stream, so everything before it is at least as
old, and a segment must be contiguous. When the learner publishes,
:meth:`RolloutAssembler.advance` drops the stale prefix of every segment
in progress and every ready segment that became too old. With
``max_staleness=0`` (synchronous PPO) that is everything acted by the
previous weights.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ...hal.steps import PolicyVersion, Steps


@dataclass
class _Stream:
    pending: dict | None = None
    """The last non-final row, waiting for its successor."""
    segment: list[dict] = field(default_factory=list)
    """Completed, contiguous transitions of the segment being built."""


@dataclass
class AssemblerStats:
    transitions: int = 0
    """Transitions completed (fresh or not)."""
    discarded: int = 0
    """Transitions dropped as too stale, of another incarnation, or cut off by a gap in the stream."""
    segments: int = 0
    """Segments made ready."""


class RolloutAssembler:
    def __init__(self, rollout_length: int, max_staleness: int, version: PolicyVersion):
        self.rollout_length = rollout_length
        self.max_staleness = max_staleness
        self.version = version
        self._streams: dict[tuple[int, int], _Stream] = {}
        self._ready: deque[dict] = deque()
        self.stats = AssemblerStats()

    # -- what the learner asks -------------------------------------------
    @property
    def ready(self) -> int:
        """Segments ready to train on."""
        return len(self._ready)

    @property
    def buffered_rows(self) -> int:
        """Rows held (ready and in progress): with credits, what bounds the actors' lead."""
        held = sum(len(s.segment) + (s.pending is not None) for s in self._streams.values())
        return held + self.rollout_length * len(self._ready)

    def rows_to_complete(self, actor_id: int, device_id: int) -> int:
        """Rows that stream must still send to complete its segment of fresh data: T transitions
        need T + 1 rows (a transition is complete when its successor arrives), less the fresh ones
        held. A stale pending row does not count: its successor completes nothing fresh."""
        stream = self._streams.get((actor_id, device_id))
        if stream is None:
            return self.rollout_length + 1
        pending = stream.pending is not None and stream.pending["incarnation"] == self.version.incarnation \
            and self._fresh(stream.pending["policy_count"])
        return self.rollout_length + 1 - len(stream.segment) - int(pending)

    def take(self, count: int) -> tuple[dict, np.ndarray] | None:
        """The oldest ``count`` ready segments as a time-major batch ``[T, count, ...]`` and the
        policy count of every transition ``[T, count]``; None until that many are ready."""
        if len(self._ready) < count:
            return None
        segments = [self._ready.popleft() for _ in range(count)]
        bootstrap = _stack([seg.pop("bootstrap_observation") for seg in segments], axis=0)  # [B, ...]
        batch = _stack(segments, axis=1)
        batch["bootstrap_observation"] = bootstrap
        return batch, batch.pop("policy_count")

    def advance(self, version: PolicyVersion) -> int:
        """The learner published ``version``: drop what is now too stale; return how many transitions."""
        self.version = version
        dropped = 0
        kept = deque()
        for seg in self._ready:
            if self._fresh(seg["policy_count"].min()):
                kept.append(seg)
            else:
                dropped += self.rollout_length
        self._ready = kept
        for stream in self._streams.values():
            stale = sum(1 for t in stream.segment if not self._fresh(t["policy_count"]))
            stream.segment = stream.segment[stale:]  # versions grow along the stream: a prefix
            dropped += stale
        self.stats.discarded += dropped
        return dropped

    # -- ingest ------------------------------------------------------------
    def add(self, steps: Steps) -> None:
        """Take one batch of consecutive rows of one stream (in stream order)."""
        key = (int(steps.actor_id[0]), int(steps.device_id[0]))
        stream = self._streams.setdefault(key, _Stream())
        for i in range(len(steps)):
            row = _row(steps, i)
            pending = stream.pending
            if pending is not None:
                if row["episode_id"] == pending["episode_id"]:
                    self._complete(stream, pending, row["observation"])
                else:  # an interrupted episode (no final row): the segment cannot continue across it
                    self._drop_segment(stream, extra=1)
            if steps.final[i]:
                stream.pending = None
            else:
                stream.pending = row

    def _fresh(self, count) -> bool:
        return 0 <= self.version.count - int(count) <= self.max_staleness

    def _complete(self, stream: _Stream, row: dict, next_observation: dict) -> None:
        self.stats.transitions += 1
        if row["incarnation"] != self.version.incarnation or not self._fresh(row["policy_count"]):
            self._drop_segment(stream, extra=1)
            return
        stream.segment.append({
            "observation": row["observation"], "action": row["action"], "reward": row["reward"],
            "terminated": row["terminated"], "truncated": row["truncated"],
            "behaviour_log_prob": row["log_prob"], "policy_count": row["policy_count"],
            "next_observation": next_observation})
        if len(stream.segment) == self.rollout_length:
            segment = _stack(stream.segment, axis=0)
            segment["bootstrap_observation"] = {k: v[-1] for k, v in segment["next_observation"].items()}
            self._ready.append(segment)
            self.stats.segments += 1
            stream.segment = []

    def _drop_segment(self, stream: _Stream, extra: int = 0) -> None:
        self.stats.discarded += len(stream.segment) + extra
        stream.segment = []


def _row(steps: Steps, i: int) -> dict:
    return {"observation": {k: v[i] for k, v in steps.observation.items()},
            "action": steps.proposed_action[i],  # the sample the log-probability belongs to (unclipped)
            "reward": steps.reward[i], "terminated": bool(steps.terminated[i]),
            "truncated": bool(steps.truncated[i]), "log_prob": steps.log_prob[i],
            "episode_id": int(steps.episode_id[i]), "incarnation": int(steps.policy_incarnation[i]),
            "policy_count": int(steps.policy_count[i])}


def _stack(items: list, axis: int):
    """Stack a list of (nested dicts of) equal-shaped values along a new ``axis``."""
    first = items[0]
    if isinstance(first, dict):
        return {k: _stack([it[k] for it in items], axis) for k in first}
    return np.stack([np.asarray(it) for it in items], axis=axis)
