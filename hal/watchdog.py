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

import threading
import time
from collections import deque
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
    __slots__ = ("name", "fn", "args", "deadline_s", "done", "result", "error", "started", "finished")

    def __init__(self, name: str, fn: Callable, args: tuple, deadline_s: float):
        self.name, self.fn, self.args, self.deadline_s = name, fn, args, deadline_s
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started: float | None = None
        self.finished: float | None = None


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
        self._cond = threading.Condition()
        self._queue: deque[_Call] = deque()
        self._current: _Call | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, name: str, fn: Callable, *args, deadline_s: float) -> _Call:
        call = _Call(name, fn, args, deadline_s)
        with self._cond:
            if self._stop:
                raise RuntimeError("the driver worker is stopped")
            self._queue.append(call)
            self._cond.notify()
        return call

    def wait(self, call: _Call) -> Any:
        while not call.done.is_set():
            current = self._current
            due = None if current is None or current.started is None else current.started + current.deadline_s
            timeout = 0.005 if due is None else max(0.0, due - time.monotonic()) + 1e-4
            if call.done.wait(timeout):
                break
            hung = self.overrun()
            if hung is not None:
                with self._cond:
                    if call in self._queue:
                        self._queue.remove(call)  # never run it after the caller gave up on it
                raise hung
        if call.error is not None:
            raise call.error
        return call.result

    def call(self, name: str, fn: Callable, *args, deadline_s: float) -> Any:
        return self.wait(self.submit(name, fn, *args, deadline_s=deadline_s))

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

    def cancel_pending(self) -> int:
        """Drop every call not yet started (their waiters get ``RuntimeError``); returns how many."""
        with self._cond:
            dropped = list(self._queue)
            self._queue.clear()
        for call in dropped:
            call.error = RuntimeError(f"driver call {call.name!r} cancelled: the driver is hung")
            call.done.set()
        return len(dropped)

    def stop(self, timeout_s: float = 1.0) -> bool:
        """Stop after the running call; returns whether the thread ended within ``timeout_s``."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self.cancel_pending()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                call = self._queue.popleft()
                call.started = time.monotonic()
                self._current = call
            try:
                call.result = call.fn(*call.args)
            except BaseException as err:  # handed to the waiter
                call.error = err
            finally:
                call.finished = time.monotonic()
                with self._cond:
                    self._current = None
                call.done.set()
