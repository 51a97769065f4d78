"""Batches ready before the learner asks: a background thread samples ahead.

The learner's step should never wait on disk: a daemon thread calls
``make_batch()`` (e.g. K stacked transition batches as numpy arrays ready
for ``jax.device_put``) and keeps up to ``depth`` of them queued. Numpy's
gathers release the GIL while page faults are served, so cold reads overlap
the learner's own work. Errors in the thread surface at the next ``get``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class Prefetcher:
    def __init__(self, make_batch: Callable[[], object], depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._make = make_batch
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replay-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = (True, self._make())
            except Exception as err:  # handed to the consumer, which re-raises it
                item = (False, err)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if not item[0]:
                return

    def get(self, timeout_s: float = 30.0):
        """The next batch; raises what ``make_batch`` raised, or TimeoutError."""
        try:
            ok, value = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no batch prefetched within {timeout_s} s") from None
        if not ok:
            raise value
        return value

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
