"""Samples-per-insert rate limiting, as Reverb's ``SampleToInsertRatio``.

The update-to-data ratio becomes a setting: with ``samples_per_insert`` s,
``min_size`` m and ``error_buffer`` e (in samples), sampling is allowed while

    inserts >= m  and  inserts * s - samples >= m * s - e

and inserting while ``inserts * s - samples <= m * s + e``. A learner that
counts one update as one sample and a step row as one insert thus trains at
s updates per row, and its actors may run at most e / s rows ahead.

Single-threaded callers ask ``can_sample`` / ``can_insert``; threaded ones
block in ``await_sample`` / ``await_insert`` with a timeout, and every
``record_*`` wakes the waiters.
"""

from __future__ import annotations

import threading
import time


class RateLimiter:
    def __init__(self, samples_per_insert: float, min_size: int, error_buffer: float):
        if samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be positive, got {samples_per_insert}")
        if min_size < 0:
            raise ValueError(f"min_size must be non-negative, got {min_size}")
        if error_buffer < max(1.0, samples_per_insert):
            raise ValueError(f"error_buffer {error_buffer} must be at least max(1, samples_per_insert): "
                             "a smaller one deadlocks inserts against samples")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size = int(min_size)
        self.error_buffer = float(error_buffer)
        self.min_diff = min_size * self.samples_per_insert - error_buffer
        self.max_diff = min_size * self.samples_per_insert + error_buffer
        self.inserts = 0
        self.samples = 0
        self._changed = threading.Condition()

    def restore(self, inserts: int) -> None:
        """Resume over a reopened buffer of ``inserts`` rows as if the ratio had been held."""
        with self._changed:
            self.inserts = int(inserts)
            self.samples = int(max(0.0, (inserts - self.min_size) * self.samples_per_insert))
            self._changed.notify_all()

    def can_sample(self, n: int = 1) -> bool:
        if self.inserts < self.min_size:
            return False
        return self.inserts * self.samples_per_insert - self.samples - n >= self.min_diff

    def can_insert(self, n: int = 1) -> bool:
        if self.inserts + n <= self.min_size:
            return True
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def behind(self) -> float:
        """Samples the inserts past ``min_size`` buy at the ratio, less those taken: how far the
        learner trails the ratio (negative: ahead of it, within the error buffer)."""
        return max(0, self.inserts - self.min_size) * self.samples_per_insert - self.samples

    def insert_room(self) -> int:
        """How many rows may be inserted now (the learner's credit budget)."""
        room = (self.max_diff + self.samples) / self.samples_per_insert - self.inserts
        return max(int(room), self.min_size - self.inserts, 0)

    def record_insert(self, n: int = 1) -> None:
        with self._changed:
            self.inserts += n
            self._changed.notify_all()

    def record_sample(self, n: int = 1) -> None:
        with self._changed:
            self.samples += n
            self._changed.notify_all()

    def await_sample(self, n: int = 1, timeout_s: float | None = None) -> bool:
        """Block until ``n`` samples are allowed; False on timeout."""
        return self._await(lambda: self.can_sample(n), timeout_s)

    def await_insert(self, n: int = 1, timeout_s: float | None = None) -> bool:
        """Block until ``n`` inserts are allowed; False on timeout."""
        return self._await(lambda: self.can_insert(n), timeout_s)

    def _await(self, allowed, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while not allowed():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
            return True
