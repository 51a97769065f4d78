"""A watchdog thread: call ``on_timeout`` when nobody kicks it within a deadline.

The control loop kicks the watchdog on every step; if inference or the loop
stalls, the watchdog fires (and keeps firing once per deadline while the
stall lasts), so the hardware side can command its safe action without
waiting for the stalled code. For a remote robot the same job is done in the
robot server, next to the hardware, so a dead actor or a dead link stops the
arm; this thread is for in-process drivers.

Timing: the thread sleeps on an event until the deadline, so it fires within
a fraction of a millisecond of it while the stalled thread sleeps or waits in
C code. A stall that holds the GIL in pure Python delays it by up to the
interpreter's switch interval (``sys.getswitchinterval()``, 5 ms by default).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Watchdog:
    """Fires ``on_timeout()`` from its own thread when not kicked for ``deadline_s``."""

    def __init__(self, deadline_s: float, on_timeout: Callable[[], None], *, name: str = "watchdog"):
        if not deadline_s > 0:
            raise ValueError(f"deadline_s: must be > 0, got {deadline_s}")
        self.deadline_s = float(deadline_s)
        self._on_timeout = on_timeout
        self._name = name
        self._cond = threading.Condition()
        self._armed = False
        self._last_kick = 0.0
        self._stop = False
        self._thread: threading.Thread | None = None
        self.fired = 0
        """How many times the deadline passed without a kick."""
        self.errors: list[str] = []
        """What ``on_timeout`` raised, if anything (the thread keeps running)."""

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._stop = True
            self._armed = False  # a restart waits for the next kick
            self._cond.notify()
        thread.join(timeout=5.0)
        self._thread = None

    def kick(self) -> None:
        """A fresh action arrived: restart the deadline (and arm the watchdog)."""
        self._last_kick = time.monotonic()
        if not self._armed:
            with self._cond:
                self._armed = True
                self._cond.notify()

    def disarm(self) -> None:
        """Stop watching until the next kick (e.g. while the device resets)."""
        with self._cond:
            self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed

    def _run(self) -> None:
        with self._cond:
            while not self._stop:
                if not self._armed:
                    self._cond.wait()
                    continue
                due = self._last_kick + self.deadline_s
                remaining = due - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self.fired += 1
                self._last_kick = time.monotonic()  # fire again one deadline later
                self._cond.release()
                try:
                    self._on_timeout()
                except Exception as err:  # keep watching; report what went wrong
                    self.errors.append(f"{type(err).__name__}: {err}")
                finally:
                    self._cond.acquire()
