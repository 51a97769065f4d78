"""A real-time control clock: run a loop at a set rate on absolute deadlines.

Deadlines are ``start + k * period``, never "now + period", so a loop whose
body fits its period does not drift however long each body takes.
``tick()`` sleeps most of the way to the next deadline and spins the last
``spin_s`` (the kernel's sleep overshoots by tens of microseconds, and by far
more under load; spinning trims the tail). The loop it expects::

    clock = RateClock(500)
    while running:
        do_one_control_step()
        clock.tick()              # returns at the next deadline
    print(clock.stats())          # period error p50 / p99 / max, missed deadlines, overruns

On a machine shared with other busy processes, :func:`set_realtime_priority`
is what keeps the tail short (see ``docs/devices.md``).

What the clock measures is the **period error**: each tick's actual period
(from the previous ``tick`` return to this one, i.e. from one loop body's
start to the next) minus the nominal period. Wake-up lateness shows in it,
and so does every overrun, with its size.

When ``tick`` is called after its deadline (the loop body ran past it), it
returns at once, so the late step starts as soon as it can, and puts the
next deadline one full period after that: it never rushes to catch up on
the deadlines that passed, and it does not idle until the next deadline of
the old schedule either (that would add up to a whole period to every late
step). Every deadline that passed is counted in ``missed``. The schedule
shifts by how far past its deadline each such call came (summed in
``schedule_shift_ms``), and by nothing else.

An **overrun** is a loop body (from one ``tick``'s return to the next call)
longer than the period; its size is the excess, which is exactly that
tick's period error (the body also ran past the deadline, so the tick
returned at once). A body 5 ms too long makes a +5 ms period and a 5 ms
overrun, whenever it started.
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
    """Period error and overruns of one clock, in milliseconds.

    ``p50_ms`` / ``p99_ms`` / ``max_ms`` are of the period error's absolute
    value (a period too long or too short), over the latest ticks;
    ``overrun_*`` are of the overruns' sizes over the latest overruns (0.0
    when there was none).
    """

    ticks: int
    """Ticks since the start (each one loop body)."""
    missed: int
    """Deadlines that passed before ``tick`` was called for them."""
    p50_ms: float
    p99_ms: float
    max_ms: float
    overruns: int = 0
    """Loop bodies longer than the period."""
    overrun_p99_ms: float = 0.0
    overrun_max_ms: float = 0.0
    schedule_shift_ms: float = 0.0
    """How far the schedule has moved: each late call's distance past its deadline, summed."""

    def to_dict(self) -> dict[str, float | int]:
        return {"ticks": self.ticks, "missed": self.missed, "p50_ms": self.p50_ms,
                "p99_ms": self.p99_ms, "max_ms": self.max_ms, "overruns": self.overruns,
                "overrun_p99_ms": self.overrun_p99_ms, "overrun_max_ms": self.overrun_max_ms,
                "schedule_shift_ms": self.schedule_shift_ms}


class RateClock:
    """Ticks at ``hz`` (10 to 1000) on absolute deadlines; measures its period error and overruns.

    The latest ``history`` ticks' period errors and overrun sizes are kept
    (two rings) for :meth:`stats` and :meth:`period_errors`.
    """

    def __init__(self, hz: float, *, spin_s: float = 0.0003, history: int = 1 << 16):
        if not MIN_HZ <= hz <= MAX_HZ:
            raise ValueError(f"hz: {hz} is outside the supported {MIN_HZ:g} to {MAX_HZ:g} Hz")
        if spin_s < 0:
            raise ValueError(f"spin_s: must be >= 0, got {spin_s}")
        if history < 1:
            raise ValueError(f"history: must be >= 1, got {history}")
        self.hz = float(hz)
        self.period_s = 1.0 / hz
        self.spin_s = min(spin_s, self.period_s / 2)
        self._errors = np.zeros(history, np.float64)  # ring: each tick's period error (s)
        self._overruns = np.zeros(history, np.float64)  # ring: each overrun's size (s)
        self.restart()

    def restart(self) -> None:
        """Start a new schedule: the first deadline is one period from now (the first
        period is measured from now too)."""
        now = time.perf_counter()
        self._next = now + self.period_s
        self._last = now
        self.ticks = 0
        self.missed = 0
        self.overruns = 0
        self.schedule_shift_s = 0.0

    def tick(self) -> float:
        """Wait for the next deadline (or, past it, return at once); return how late this
        tick returned after its deadline (s)."""
        deadline = self._next
        now = time.perf_counter()
        excess = now - self._last - self.period_s  # > 0: the body overran the period
        if excess > 0:
            self._overruns[self.overruns % self._overruns.shape[0]] = excess
            self.overruns += 1
        if now > deadline:  # the body ran past the deadline: go on at once, never rush to catch up
            late = now - deadline
            self.missed += int(late // self.period_s) + 1
            self.schedule_shift_s += late
            self._next = now + self.period_s
        else:
            coarse = deadline - self.spin_s - now
            if coarse > 0:
                time.sleep(coarse)
            while (now := time.perf_counter()) < deadline:
                pass
            self._next = deadline + self.period_s
        self._errors[self.ticks % self._errors.shape[0]] = now - self._last - self.period_s
        self._last = now
        self.ticks += 1
        return now - deadline

    def period_errors(self) -> np.ndarray:
        """The latest ticks' period errors (actual minus nominal period, s, signed: a late
        period is positive), oldest first."""
        size = self._errors.shape[0]
        if self.ticks <= size:
            return self._errors[: self.ticks].copy()
        return np.roll(self._errors, -(self.ticks % size))

    def stats(self) -> ClockStats:
        """p50 / p99 / max of the period error's absolute value over the latest ticks, every
        missed deadline, and the overruns: how many, and p99 / max of their sizes."""
        n = min(self.ticks, self._errors.shape[0])
        p50 = p99 = top = 0.0
        if n:
            ms = np.abs(self._errors[:n]) * 1e3
            p50, p99 = (float(v) for v in np.percentile(ms, [50, 99]))
            top = float(ms.max())
        m = min(self.overruns, self._overruns.shape[0])
        o99 = omax = 0.0
        if m:
            sizes = self._overruns[:m] * 1e3
            o99, omax = float(np.percentile(sizes, 99)), float(sizes.max())
        return ClockStats(self.ticks, self.missed, p50, p99, top, self.overruns, o99, omax,
                          self.schedule_shift_s * 1e3)
