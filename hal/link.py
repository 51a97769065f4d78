"""What the actor loop asks of its link to the learner (:class:`~.wire.client.LearnerLink` is the one
that speaks the wire; tests and single-process tools may bring their own).

The loop it expects::

    link.poll(0)                                    # heartbeats, acks, credits, weights
    if not link.connected: ...                      # the learner is gone: act on, spool
    weights = link.take_weights()                   # (version, arrays) newly arrived, or None
    if link.credits >= rows: link.send_steps(device_id, steps)
    ... until link.bye_reason is not None           # the learner said goodbye
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from .steps import PolicyVersion, Steps


class Link(Protocol):
    bye_reason: str | None
    """Why the learner ended the session (None while it lasts)."""
    connected: bool
    """Whether the learner is reachable now (False while the link is down: the actor goes on and
    spools, and a device whose policy never had weights holds its safe action)."""

    @property
    def credits(self) -> int:
        """Rows the learner will still take: the actor sends, or waits, within them."""

    def poll(self, timeout_ms: int = 0) -> None:
        """Do the link's due work (receive, acknowledge, resend, heartbeat), waiting at most ``timeout_ms``."""

    def send_steps(self, device_id: int, steps: Steps) -> int:
        """Hand over one batch of a device's rows; return its sequence number. Raises
        :class:`~.wire.spool.SpoolFull` when it cannot take the batch now (the actor pauses)."""

    def take_weights(self) -> tuple[PolicyVersion, dict[str, np.ndarray]] | None:
        """The newest weights received since the last call, if any."""

    def metrics(self) -> dict:
        """The link's figures for the actor's report (traffic, RTT, resends, backlog)."""


class NullLink:
    """A link to no learner: takes every batch and keeps none, sends nothing back, never says
    goodbye. For a loop run without a learner: tests, benchmarks, watching a robot in the console."""

    bye_reason: str | None = None
    connected = True
    credits = 1 << 40

    def __init__(self):
        self.rows = self.batches = 0

    def poll(self, timeout_ms: int = 0) -> None:
        if timeout_ms > 0:
            time.sleep(timeout_ms / 1000)

    def send_steps(self, device_id: int, steps: Steps) -> int:
        self.rows += len(steps)
        self.batches += 1
        return self.batches

    def take_weights(self) -> None:
        return None

    def metrics(self) -> dict:
        return {"rows_sent": self.rows, "batches_sent": self.batches}
