"""A real-time control clock: run a loop at a set rate on absolute deadlines.

Deadlines are ``start + k * period``, never "now + period", so the loop does
not drift however long each iteration takes. ``tick()`` sleeps most of the
way to the next deadline and spins the last ``spin_s`` (the kernel's sleep
overshoots by tens of microseconds, and by far more under load; spinning
trims the tail). The loop it expects::

    clock = RateClock(500)
    while running:
        do_one_control_step()
        clock.tick()              # returns at the next deadline
    print(clock.stats())          # p50 / p99 / max lateness, missed deadlines

On a machine shared with other busy processes, :func:`set_realtime_priority`
is what keeps the tail short (see ``docs/devices.md``).

Lateness (how long after its deadline ``tick`` returned) is the period error
the clock measures. A deadline is *missed* when the loop body ran past it:
the clock then skips to the next deadline still ahead and counts every
deadline it skipped, so a late iteration never makes the next ones rush.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np


def set_realtime_priority(priority: int = 50) -> bool:
    """Run the calling thread under ``SCHED_FIFO`` at ``priority`` (1-99), if permitted.

    Under normal scheduling a loop sharing its cores with busy processes
    waits milliseconds for its wake-ups (the tail the clock measures); a
    real-time priority removes most of it. Needs root or ``CAP_SYS_NICE``
    (or an rtprio limit); returns False, changing nothing, where not allowed.
    The kernel keeps 5% of each second for normal tasks, so a runaway loop
    cannot lock the machine. Threads started afterwards inherit the policy.
    """
    if not 1 <= priority <= 99:
        raise ValueError(f"priority: must be in 1..99, got {priority}")
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (AttributeError, PermissionError, OSError):
        return False
    return True


MIN_HZ = 10.0
MAX_HZ = 1000.0


@dataclass(frozen=True)
class ClockStats:
    """Period error of one clock, in milliseconds."""

    ticks: int
    """Deadlines the loop made (late or not)."""
    missed: int
    """Deadlines skipped because the loop body ran past them."""
    p50_ms: float
    p99_ms: float
    max_ms: float

    def to_dict(self) -> dict[str, float | int]:
        return {"ticks": self.ticks, "missed": self.missed, "p50_ms": self.p50_ms,
                "p99_ms": self.p99_ms, "max_ms": self.max_ms}


class RateClock:
    """Ticks at ``hz`` (10 to 1000) on absolute deadlines; measures its own jitter."""

    def __init__(self, hz: float, *, spin_s: float = 0.0003, history: int = 1 << 16):
        if not MIN_HZ <= hz <= MAX_HZ:
            raise ValueError(f"hz: {hz} is outside the supported {MIN_HZ:g} to {MAX_HZ:g} Hz")
        if spin_s < 0:
            raise ValueError(f"spin_s: must be >= 0, got {spin_s}")
        self.hz = float(hz)
        self.period_s = 1.0 / hz
        self.spin_s = min(spin_s, self.period_s / 2)
        self._lateness = np.zeros(history, np.float64)  # ring of the latest ticks
        self.restart()

    def restart(self) -> None:
        """Start a new schedule: the first deadline is one period from now."""
        self._next = time.perf_counter() + self.period_s
        self.ticks = 0
        self.missed = 0

    def tick(self) -> float:
        """Wait for the next deadline; return how late we woke up (s)."""
        deadline = self._next
        now = time.perf_counter()
        if now > deadline:  # the body overran: skip, never rush to catch up
            skipped = int((now - deadline) // self.period_s) + 1
            self.missed += skipped
            deadline += skipped * self.period_s
        coarse = deadline - self.spin_s - now
        if coarse > 0:
            time.sleep(coarse)
        while (now := time.perf_counter()) < deadline:
            pass
        lateness = now - deadline
        self._lateness[self.ticks % self._lateness.shape[0]] = lateness
        self.ticks += 1
        self._next = deadline + self.period_s
        return lateness

    def stats(self) -> ClockStats:
        """p50 / p99 / max lateness over the latest ticks, and every missed deadline."""
        n = min(self.ticks, self._lateness.shape[0])
        if n == 0:
            return ClockStats(0, self.missed, 0.0, 0.0, 0.0)
        ms = self._lateness[:n] * 1e3
        p50, p99 = np.percentile(ms, [50, 99])
        return ClockStats(self.ticks, self.missed, float(p50), float(p99), float(ms.max()))
