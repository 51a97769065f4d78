"""A watchdog thread: call ``on_timeout`` when nobody kicks it within a deadline.

The control loop kicks the watchdog on every step; if inference or the loop
stalls, the watchdog fires (and keeps firing once per deadline while the
stall lasts), so the hardware side can command its safe action without
waiting for the stalled code. For a remote robot the same job is done in the
robot server, next to the hardware, so a dead actor or a dead link stops the
arm; this thread is for in-process drivers.

:class:`DriverWorker` is the other half of that job: one thread that makes
every call into a driver, in order, each against a deadline. A call that
overruns is reported by name (:class:`DriverHung`); Python cannot interrupt
it, so the caller's only remedy is to latch an e-stop and say so.

Timing: the thread sleeps on an event until the deadline, so it fires within
a fraction of a millisecond of it while the stalled thread sleeps or waits in
C code. A stall that holds the GIL in pure Python delays it by up to the
interpreter's switch interval (``sys.getswitchinterval()``, 5 ms by default).
"""

from __future__ import annotations

import _thread
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any


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


class DriverHung(RuntimeError):
    """A driver call overran its deadline; it may still be running (nothing can stop it)."""

    def __init__(self, call: _Call):
        self.call = call.name
        self.deadline_s = call.deadline_s
        self._record = call
        super().__init__(f"driver call {call.name!r} overran its {call.deadline_s:.3g} s deadline")

    @property
    def seconds(self) -> float:
        """How long the call has run (so far, or in all once it returned)."""
        record = self._record
        end = record.finished if record.finished is not None else time.monotonic()
        return end - record.started

    @property
    def returned(self) -> bool:
        return self._record.finished is not None


class _Call:
    __slots__ = ("name", "fn", "args", "deadline_s", "number", "cancelled", "result", "error", "started",
                 "finished", "_done")

    def __init__(self, name: str, fn: Callable, args: tuple, deadline_s: float, number: int):
        self.name, self.fn, self.args, self.deadline_s, self.number = name, fn, args, deadline_s, number
        self.cancelled = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.started: float | None = None
        self.finished: float | None = None
        self._done = _thread.allocate_lock()  # held until the call is over: the cheapest hand-back
        self._done.acquire()

    def wait_done(self, timeout_s: float) -> bool:
        if self._done.acquire(timeout=max(timeout_s, 0.0)):
            self._done.release()
            return True
        return False


class DriverWorker:
    """Makes every driver call on one thread, in submission order, each against a deadline.

    A vendor SDK is rarely thread-safe; threads that need the driver (a
    socket thread, a watchdog thread) ``submit`` here instead of calling it::

        worker = DriverWorker()
        call = worker.submit("command", driver.command, action, deadline_s=0.25)
        worker.wait(call)          # the result, the driver's exception, or DriverHung
        worker.overrun()           # DriverHung for the running call once past its deadline

    ``wait`` returns as soon as any call ahead of its own overruns, so no
    caller waits longer than the deadline of the call that is running.
    """

    def __init__(self, name: str = "driver"):
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._numbers = itertools.count()  # next() is atomic: submitters need no lock
        self._cancel_below = 0
        self._current: _Call | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, name: str, fn: Callable, *args, deadline_s: float) -> _Call:
        if self._stopped:
            raise RuntimeError("the driver worker is stopped")
        call = _Call(name, fn, args, deadline_s, next(self._numbers))
        self._queue.put(call)
        return call

    def wait(self, call: _Call) -> Any:
        while True:
            current = self._current
            due = None if current is None or current.started is None else current.started + current.deadline_s
            timeout = 0.005 if due is None else due - time.monotonic() + 1e-4
            if call.wait_done(timeout):
                break
            hung = self.overrun()
            if hung is not None:
                call.cancelled = True  # never run it after its caller gave up on it
                raise hung
        if call.error is not None:
            raise call.error
        return call.result

    def call(self, name: str, fn: Callable, *args, deadline_s: float) -> Any:
        return self.wait(self.submit(name, fn, *args, deadline_s=deadline_s))

    def phase(self, name: str, deadline_s: float) -> None:
        """From inside a running call: the rest of it is ``name``, due ``deadline_s`` from now."""
        current = self._current
        current.name, current.deadline_s, current.started = name, deadline_s, time.monotonic()

    def overrun(self) -> DriverHung | None:
        """The running call, if it has passed its deadline."""
        current = self._current
        if current is not None and current.started is not None and (
                time.monotonic() - current.started > current.deadline_s):
            return DriverHung(current)
        return None

    def due(self) -> float | None:
        """When the running call passes its deadline (``time.monotonic`` clock), if one runs."""
        current = self._current
        return None if current is None or current.started is None else current.started + current.deadline_s

    def cancel_pending(self) -> None:
        """Never run the calls submitted so far and not yet started (their waiters get ``RuntimeError``)."""
        self._cancel_below = next(self._numbers)

    def stop(self, timeout_s: float = 1.0) -> bool:
        """Stop after the running call; returns whether the thread ended within ``timeout_s``."""
        self._stopped = True
        self.cancel_pending()
        self._queue.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (call := self._queue.get()) is not None:
            if call.cancelled or call.number < self._cancel_below:
                call.error = RuntimeError(f"driver call {call.name!r} cancelled: the driver was hung")
            else:
                call.started = time.monotonic()
                self._current = call
                try:
                    call.result = call.fn(*call.args)
                except BaseException as err:  # handed to the waiter
                    call.error = err
                finally:
                    call.finished = time.monotonic()
                    self._current = None
            call._done.release()
