"""Human intervention: an input hook through which a person overrides the policy.

The actor loop asks its :class:`InterventionSource` once per step, with the
current observation, *after* the policy has proposed its action::

    proposed = policy.act(o_t)
    human = intervention.poll(o_t)          # None: no override this step
    command = proposed if human is None else human
    applied = device.step(command)          # the safety layer still applies

An overridden step is recorded with ``source=Source.INTERVENTION``, the
policy's action as ``proposed_action`` and the human's action (after the
safety layer) as ``action``, so learners can tell the two apart (HIL-SERL
style). Sources here: a scripted one for tests and replays,
:class:`HeldCommand`, a thread-safe slot that any input reader (keyboard,
spacemouse, a GUI) sets from its own thread, and :class:`KeyboardTeleop`,
which reads key presses from a terminal. :mod:`.teleop` builds sources from
a name (``keyboard``, ``gamepad``, ``spacemouse``, ``script:module:function``).

Two optional parts of a source, which loops look for: ``new_episode()``,
called when an episode starts (a script counts its steps from there), and
``close()``. ``poll`` may raise :class:`EpisodeAborted` when the person asks
to throw the episode away (a key, a button): the loop ends it unrecorded.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

import numpy as np


class EpisodeAborted(Exception):
    """Raised by a source's ``poll``: the person threw this episode away (it is not recorded)."""


@runtime_checkable
class InterventionSource(Protocol):
    def poll(self, observation: dict[str, np.ndarray]) -> np.ndarray | None:
        """The person's action for this step, or None to let the policy act."""


def new_episode(source) -> None:
    """Tell a source that an episode starts, if it cares (``new_episode()`` is optional)."""
    hook = getattr(source, "new_episode", None)
    if hook is not None:
        hook()


class ScriptedIntervention:
    """Overrides at given step numbers (counted from 0 over every poll) or by a rule.

    ``ScriptedIntervention({3: a, 4: a})`` overrides steps 3 and 4;
    ``ScriptedIntervention(rule=lambda t, o: ...)`` asks ``rule`` each step.
    """

    def __init__(self, actions: Mapping[int, np.ndarray] | None = None, *,
                 rule: Callable[[int, dict[str, np.ndarray]], np.ndarray | None] | None = None):
        if (actions is None) == (rule is None):
            raise ValueError("give exactly one of actions and rule")
        self._actions = {int(t): np.asarray(a) for t, a in (actions or {}).items()}
        self._rule = rule
        self.polls = 0
        self.overrides = 0

    def poll(self, observation):
        t = self.polls
        self.polls += 1
        action = self._rule(t, observation) if self._rule is not None else self._actions.get(t)
        if action is not None:
            self.overrides += 1
        return action


class HeldCommand:
    """The latest command of a human input device, held until released.

    An input thread calls :meth:`hold` with the action the person commands
    (e.g. on each spacemouse event while a button is pressed) and
    :meth:`release` when they let go; the actor loop polls it each step.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._action: np.ndarray | None = None

    def hold(self, action) -> None:
        action = np.array(action, copy=True)
        with self._lock:
            self._action = action

    def release(self) -> None:
        with self._lock:
            self._action = None

    def poll(self, observation):
        with self._lock:
            return self._action


class KeyboardTeleop:
    """Key presses from a terminal (or any file descriptor) as held actions.

    ``keymap`` maps a key to an action; a press overrides the policy for
    ``hold_s`` seconds (a held key repeats, so holding it keeps control),
    then control returns to the policy. A reader thread does the reading, so
    the control loop never blocks on input. On a terminal it switches to
    cbreak mode (keys arrive unbuffered) and restores it on :meth:`close`.
    ``abort_key`` makes the next ``poll`` raise :class:`EpisodeAborted`.
    Every other key goes to :attr:`other_keys`, a queue, so that one reader
    serves the terminal (an operator's answers read from it).
    """

    def __init__(self, keymap: Mapping[str, np.ndarray], *, fd: int | None = None, hold_s: float = 0.25,
                 abort_key: str | None = None):
        if not keymap or any(len(k) != 1 for k in keymap):
            raise ValueError(f"keymap: needs single-character keys, got {list(keymap)}")
        if abort_key is not None and (len(abort_key) != 1 or abort_key in keymap):
            raise ValueError(f"abort_key: one character outside the keymap, got {abort_key!r}")
        self._keymap = {k: np.asarray(a) for k, a in keymap.items()}
        self.hold_s = hold_s
        self.abort_key = abort_key
        self.other_keys: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._abort = threading.Event()
        self._fd = 0 if fd is None else fd
        self._held = HeldCommand()
        self._last_press = 0.0
        self._stop = threading.Event()
        self._saved_tty = None
        if os.isatty(self._fd):
            import termios
            import tty

            self._saved_tty = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
        self._thread = threading.Thread(target=self._read, name="keyboard-teleop", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.05)
            if not ready:
                continue
            data = os.read(self._fd, 64)
            if not data:
                return
            for key in data.decode(errors="ignore"):
                if key in self._keymap:
                    self._held.hold(self._keymap[key])
                    self._last_press = time.monotonic()
                elif key == self.abort_key:
                    self._abort.set()
                else:
                    self.other_keys.put(key)

    def poll(self, observation):
        if self._abort.is_set():
            self._abort.clear()
            self._last_press = 0.0
            raise EpisodeAborted(f"key {self.abort_key!r} pressed")
        if time.monotonic() - self._last_press > self.hold_s:
            return None
        return self._held.poll(observation)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        if self._saved_tty is not None:
            import termios

            with contextlib.suppress(termios.error):
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved_tty)
