"""Who gets which weights when: one peer's weights as its sender sees them, and the rule for the next
update it gets. The learner keeps one :class:`Follower` per actor session and a relay one per actor
behind it, so an actor cannot tell which of the two serves it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..hal.steps import PolicyVersion
from .publisher import Update, WeightPublisher

WEIGHTS_RESEND_MAX_S = 60.0


@dataclass
class Follower:
    """What a peer holds, what it was last sent and when, and its downlink as measured by how long it
    took to say it holds what it was sent."""

    held: PolicyVersion | None = None
    encodings: frozenset[str] | None = None
    """The weight encodings it decodes (None: it did not say, so all of them)."""
    sent: PolicyVersion | None = None
    sent_at: float = 0.0
    sent_bytes: int = 0
    resend_s: float = 0.0
    """Wait before sending unacknowledged weights again; doubles each time (a reader that never drains)."""
    downlink_bps: float | None = None

    def note_held(self, held: PolicyVersion) -> None:
        if held == self.sent and self.held != held and self.sent_at:
            elapsed = max(time.monotonic() - self.sent_at, 1e-6)
            bps = self.sent_bytes / elapsed
            self.downlink_bps = bps if self.downlink_bps is None else 0.7 * self.downlink_bps + 0.3 * bps
        self.held = held

    def next_update(self, publisher: WeightPublisher, resend_s: float) -> Update | None:
        """The update to send now (entered as sent), or None: it holds the current weights, or
        others are in flight and not yet overdue. A slow reader never queues a backlog of stale weights:
        it gets the newest once it holds the last ones it was sent."""
        version = publisher.version
        if version is None or self.held == version:
            return None
        now = time.monotonic()
        unacknowledged = self.sent is not None and self.held != self.sent
        if unacknowledged and now - self.sent_at < self.resend_s:
            return None
        self.resend_s = min(2 * self.resend_s, WEIGHTS_RESEND_MAX_S) if unacknowledged else resend_s
        update = publisher.update_for(self.held, self.downlink_bps, self.encodings)
        self.sent, self.sent_at, self.sent_bytes = version, now, update.nbytes
        return update
