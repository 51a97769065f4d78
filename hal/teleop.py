"""Teleoperation sources by name: the person's input devices as intervention sources.

``make_source(spec, action_spec)`` returns an
:class:`~.intervention.InterventionSource` for one of:

* ``keyboard``: keys at the terminal. Keys ``1``-``7`` push action
  element 0-6 up, ``q w e r t y u`` push it down (half its range, held for
  a quarter second, repeated while a key is held), space commands the
  middle of the range, ``x`` throws the episode away.
* ``gamepad[:PATH]``: a Linux joystick read through ``evdev``; PATH is an
  ``/dev/input/event*`` device (default: the first with sticks and gamepad
  buttons) or a *recording* of input events (below). Action elements follow
  the left stick (x, y up), right stick (x, y up), d-pad (x, y up), left and
  right triggers. The person has control while a stick is out of its dead
  zone or the left bumper is held; Select throws the episode away.
* ``spacemouse[:PATH]``: a 3Dconnexion SpaceMouse through the same
  ``evdev`` path (the kernel exposes it as an input device with six axes:
  x, y, z, rx, ry, rz in action order). Control while an axis is out of its
  dead zone or the left button is held; the right button throws the episode
  away.
* ``lerobot:TYPE[:key=value,...]``: a LeRobot teleoperator (a leader arm,
  its gamepad or keyboard, any ``lerobot_teleoperator_*`` plugin) made as
  LeRobot makes it, its action mapped onto the device's by name
  (:mod:`.teleop_lerobot`; ``pip install 'embodyrl[lerobot]'``).
* ``script:module:function``: ``function(observation, step) -> action or
  None`` (``step`` counts from 0 in each episode); for scripted experts and
  tests. It may raise :class:`~.intervention.EpisodeAborted`. The module is
  found in the working directory too, as a robot file's factories are.

Gamepads and spacemice decode events in one place, :class:`EventTeleop`,
fed either by a device (``pip install 'embodyrl[teleop]'`` brings evdev,
Linux only) or by a recording: a JSON-lines file whose first line is
``{"format": "embodyrl.input-events", "version": 1, "absinfo": {CODE:
[min, max, flat]}}`` and each further line ``[seconds, type, code,
value]``, replayed at its recorded times. :func:`record_events` writes one
from a device (``python -m embodyrl.hal.teleop record DEVICE OUT
SECONDS``), so a session at the robot can be replayed through the same
decoding anywhere.
"""

from __future__ import annotations

import json
import os
import select
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .intervention import EpisodeAborted, KeyboardTeleop
from .plugins import import_here
from .specs import ArraySpec, SpecError

# Linux input event types and codes (linux/input-event-codes.h; evdev.ecodes has the same).
EV_SYN, EV_KEY, EV_REL, EV_ABS = 0, 1, 2, 3
SYN_REPORT = 0
ABS_X, ABS_Y, ABS_Z, ABS_RX, ABS_RY, ABS_RZ, ABS_HAT0X, ABS_HAT0Y = 0, 1, 2, 3, 4, 5, 16, 17
BTN_0, BTN_1, BTN_SOUTH, BTN_TL, BTN_SELECT = 256, 257, 304, 310, 314
EVENTS_FORMAT = "embodyrl.input-events"

KEYBOARD_UP, KEYBOARD_DOWN = "1234567", "qwertyu"
KEYBOARD_CENTRE, KEYBOARD_ABORT = " ", "x"


class TeleopError(ValueError):
    """A teleop source that cannot be made here (unknown name, missing library, no device)."""


@dataclass(frozen=True)
class Axis:
    """One action element's input: an event type and code, its sign, and how it rests."""

    type: int
    code: int
    sign: float = 1.0
    trigger: bool = False
    """Rests at its minimum and reads 0..1 (a trigger), rather than -1..1 around the middle."""


@dataclass(frozen=True)
class Layout:
    """What a kind of device's events mean."""

    name: str
    axes: tuple[Axis, ...]
    """In action order: element i follows axes[i]."""
    takeover_button: int
    """Held: the person has control even with every axis at rest."""
    abort_button: int
    """Pressed: the episode is thrown away."""
    default_absinfo: dict[int, tuple[int, int, int]]
    """(min, max, flat) of absolute axes a recording or device does not describe."""
    rel_range: float = 350.0
    """Full deflection of a relative axis."""
    rel_hold_s: float = 0.1
    """A relative axis reads 0 once it has reported nothing for this long (the kernel drops the
    zeros of relative axes, so a released puck just goes quiet)."""


_STICK, _HAT, _TRIGGER = (-32768, 32767, 4000), (-1, 1, 0), (0, 255, 10)
GAMEPAD = Layout(
    "gamepad",
    (Axis(EV_ABS, ABS_X), Axis(EV_ABS, ABS_Y, -1.0), Axis(EV_ABS, ABS_RX), Axis(EV_ABS, ABS_RY, -1.0),
     Axis(EV_ABS, ABS_HAT0X), Axis(EV_ABS, ABS_HAT0Y, -1.0),
     Axis(EV_ABS, ABS_Z, trigger=True), Axis(EV_ABS, ABS_RZ, trigger=True)),
    takeover_button=BTN_TL, abort_button=BTN_SELECT,
    default_absinfo={ABS_X: _STICK, ABS_Y: _STICK, ABS_RX: _STICK, ABS_RY: _STICK,
                     ABS_HAT0X: _HAT, ABS_HAT0Y: _HAT, ABS_Z: _TRIGGER, ABS_RZ: _TRIGGER})
SPACEMOUSE = Layout(
    "spacemouse", tuple(Axis(EV_ABS, code) for code in range(6)),
    takeover_button=BTN_0, abort_button=BTN_1,
    default_absinfo=dict.fromkeys(range(6), (-350, 350, 0)))
"""Axes may arrive as EV_REL (older kernels) or EV_ABS with the same codes 0-5: both are read."""
LAYOUTS = {"gamepad": GAMEPAD, "spacemouse": SPACEMOUSE}


class EventTeleop:
    """Linux input events -> the person's action: the one decoding path of gamepads and spacemice.

    :meth:`feed` takes each ``(type, code, value)`` event (from any thread); a ``SYN_REPORT``
    makes the frame so far current. :meth:`poll` returns the action while the person has
    control (an axis out of its dead zone, or the take-over button held), else None, and raises
    :class:`EpisodeAborted` once after the abort button was pressed. An axis at full deflection
    commands the action's bound (times ``gain``); an unbounded element gets ``gain`` times -1..1.
    """

    def __init__(self, layout: Layout, action_spec: ArraySpec, *,
                 absinfo: dict[int, tuple[int, int, int]] | None = None,
                 deadzone: float = 0.1, gain: float = 1.0):
        (n,) = action_spec.shape if len(action_spec.shape) == 1 else (None,)
        if n is None or n > len(layout.axes):
            raise TeleopError(f"{layout.name}: drives up to {len(layout.axes)} action elements in a "
                              f"flat action; this action is shaped {action_spec.shape}")
        self.layout, self.action_spec = layout, action_spec
        self.axes = layout.axes[:n]
        self.absinfo = {**layout.default_absinfo, **(absinfo or {})}
        self.deadzone, self.gain = deadzone, gain
        low = action_spec.minimum if action_spec.minimum is not None else np.full(n, -1.0)
        high = action_spec.maximum if action_spec.maximum is not None else np.full(n, 1.0)
        low, high = np.broadcast_to(low, (n,)).astype(np.float64), np.broadcast_to(high, (n,)).astype(np.float64)
        bounded = np.isfinite(low) & np.isfinite(high)
        self._centre = np.where(bounded, (low + high) / 2, 0.0)
        self._half = np.where(bounded, (high - low) / 2, 1.0)
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, int], int] = {}
        self._values = np.zeros(n)  # each axis in -1..1 (triggers 0..1), dead zone applied
        self._relative_at = np.full(n, np.nan)  # when a relative axis last reported (NaN: absolute)
        self._buttons: set[int] = set()
        self._abort = False
        self.events = 0

    def _normalise(self, axis: Axis, event_type: int, value: int) -> float:
        if event_type == EV_REL:
            x = value / self.layout.rel_range
            flat = 0.0
        else:
            low, high, flat_raw = self.absinfo.get(axis.code, (-1, 1, 0))
            span = max(high - low, 1)
            if axis.trigger:
                x, flat = (value - low) / span, flat_raw / span
            else:
                x, flat = (2.0 * value - low - high) / span, 2.0 * flat_raw / span
        x = float(np.clip(x, -1.0, 1.0))
        return 0.0 if abs(x) <= max(self.deadzone, flat) else axis.sign * x

    def feed(self, event_type: int, code: int, value: int) -> None:
        """Take one input event."""
        with self._lock:
            self.events += 1
            if event_type == EV_SYN and code == SYN_REPORT:
                for (kind, c), v in self._pending.items():
                    for i, axis in enumerate(self.axes):
                        if axis.code == c and (kind == axis.type or kind == EV_REL):
                            self._values[i] = self._normalise(axis, kind, v)
                            self._relative_at[i] = time.monotonic() if kind == EV_REL else np.nan
                self._pending.clear()
            elif event_type in (EV_ABS, EV_REL):
                self._pending[(event_type, code)] = value
            elif event_type == EV_KEY:
                if value:
                    self._buttons.add(code)
                    if code == self.layout.abort_button:
                        self._abort = True
                else:
                    self._buttons.discard(code)

    def poll(self, observation=None) -> np.ndarray | None:
        with self._lock:
            if self._abort:
                self._abort = False
                raise EpisodeAborted(f"{self.layout.name}: abort button pressed")
            stale = time.monotonic() - self._relative_at > self.layout.rel_hold_s  # False where NaN
            self._values[stale] = 0.0
            if not (self._values.any() or self.layout.takeover_button in self._buttons):
                return None
            action = self._centre + self.gain * self._values * self._half
        return action.astype(self.action_spec.dtype)


class _Reader:
    """A daemon thread feeding an :class:`EventTeleop` until closed."""

    def __init__(self, teleop: EventTeleop, run: Callable[[threading.Event], None], name: str):
        self.teleop = teleop
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._guarded, args=(run,), name=name, daemon=True)
        self._thread.start()

    def _guarded(self, run) -> None:
        try:
            run(self._stop)
        except BaseException as err:  # noqa: BLE001 - reported by poll
            self.error = err

    def poll(self, observation=None):
        if self.error is not None:
            raise TeleopError(f"{self.teleop.layout.name}: input stopped: {self.error}") from self.error
        return self.teleop.poll(observation)

    @property
    def finished(self) -> bool:
        return not self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


def read_recording(path: str | Path) -> tuple[dict[int, tuple[int, int, int]], list[tuple[float, int, int, int]]]:
    """(absinfo, events) of a recording of input events; a malformed one raises TeleopError."""
    lines = Path(path).read_text().splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
        if not isinstance(header, dict) or header.get("format") != EVENTS_FORMAT:
            raise ValueError(f"the first line is not an {EVENTS_FORMAT} header")
        absinfo = {int(k): tuple(int(x) for x in v) for k, v in header.get("absinfo", {}).items()}
        events = []
        for number, line in enumerate(lines[1:], start=2):
            if line.strip():
                t, kind, code, value = json.loads(line)
                events.append((float(t), int(kind), int(code), int(value)))
                if len(events) > 1 and events[-1][0] < events[-2][0]:
                    raise ValueError(f"line {number}: time goes back")
    except (ValueError, TypeError) as err:
        raise TeleopError(f"{path}: not a recording of input events ({err})") from None
    return absinfo, events


def replay(teleop: EventTeleop, events: list[tuple[float, int, int, int]], *,
           speed: float = 1.0) -> _Reader:
    """Feed recorded events to ``teleop`` at their times (``speed`` times faster), in a thread."""
    def run(stop: threading.Event) -> None:
        start = time.monotonic()
        for t, kind, code, value in events:
            wait = start + t / speed - time.monotonic()
            if wait > 0 and stop.wait(wait):
                return
            teleop.feed(kind, code, value)

    return _Reader(teleop, run, f"{teleop.layout.name}-replay")


def _evdev():
    try:
        import evdev
    except ImportError:
        raise TeleopError("gamepad and spacemouse read Linux input devices through evdev: "
                          "pip install 'embodyrl[teleop]' (Linux only)") from None
    return evdev


def find_device(layout: Layout) -> str:
    """The first input device that looks like ``layout``'s kind (raises TeleopError if none)."""
    evdev = _evdev()
    for path in evdev.list_devices():
        device = evdev.InputDevice(path)
        try:
            caps = device.capabilities()
            name = device.name.lower()
        finally:
            device.close()
        keys = set(caps.get(EV_KEY, []))
        if layout is SPACEMOUSE and ("3dconnexion" in name or "spacemouse" in name or "space navigator" in name):
            return path
        if layout is GAMEPAD and BTN_SOUTH in keys and ABS_X in {c for c in caps.get(EV_ABS, [])}:
            return path
    raise TeleopError(f"{layout.name}: no such input device found (is it plugged in, and may this user "
                      "read /dev/input/event*? The input group usually may)")


def _absinfo(device) -> dict[int, tuple[int, int, int]]:
    return {code: (info.min, info.max, info.flat)
            for code, info in device.capabilities(absinfo=True).get(EV_ABS, [])}


def open_device(teleop_layout: Layout, path: str, action_spec: ArraySpec, **kwargs) -> _Reader:
    """Read a live input device (through evdev) into an :class:`EventTeleop`. Untested here: no
    device is plugged into the machines the tests run on; the decoding is tested on recordings."""
    evdev = _evdev()
    device = evdev.InputDevice(path)
    teleop = EventTeleop(teleop_layout, action_spec, absinfo=_absinfo(device), **kwargs)

    def run(stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                if select.select([device.fd], [], [], 0.05)[0]:
                    for event in device.read():
                        teleop.feed(event.type, event.code, event.value)
        finally:
            device.close()

    return _Reader(teleop, run, f"{teleop_layout.name}-input")


def record_events(device_path: str, out: str | Path, seconds: float) -> int:
    """Write ``seconds`` of a live device's events as a recording; return how many."""
    evdev = _evdev()
    device = evdev.InputDevice(device_path)
    header = {"format": EVENTS_FORMAT, "version": 1, "device": device.name,
              "absinfo": {str(k): list(v) for k, v in _absinfo(device).items()}}
    count, start = 0, time.monotonic()
    with open(out, "w") as f:
        f.write(json.dumps(header) + "\n")
        while time.monotonic() - start < seconds:
            if select.select([device.fd], [], [], 0.05)[0]:
                for event in device.read():
                    f.write(json.dumps([round(time.monotonic() - start, 6), event.type, event.code,
                                        event.value]) + "\n")
                    count += 1
    device.close()
    return count


class ScriptSource:
    """``function(observation, step) -> action or None`` as a source; ``step`` counts from 0 in
    each episode. Actions are checked against the action's shape (the safety layer bounds them)."""

    def __init__(self, function: Callable, action_spec: ArraySpec, name: str = "script"):
        self.function, self.action_spec, self.name = function, action_spec, name
        self.step = 0

    def new_episode(self) -> None:
        self.step = 0

    def poll(self, observation):
        action = self.function(observation, self.step)
        self.step += 1
        if action is None:
            return None
        action = np.asarray(action, self.action_spec.dtype)
        if action.shape != self.action_spec.shape:
            raise SpecError(f"{self.name}: returned an action shaped {action.shape}, "
                            f"not {self.action_spec.shape}")
        return action


def keyboard_keymap(action_spec: ArraySpec, gain: float = 0.5) -> dict[str, np.ndarray]:
    """Keys ``1``-``7`` up, ``q``-``u`` down by ``gain`` of each element's half-range; space: middle."""
    if len(action_spec.shape) != 1 or action_spec.shape[0] > len(KEYBOARD_UP):
        raise TeleopError(f"keyboard: drives up to {len(KEYBOARD_UP)} action elements in a flat "
                          f"action; this action is shaped {action_spec.shape}")
    n = action_spec.shape[0]
    low = np.broadcast_to(action_spec.minimum if action_spec.minimum is not None else -1.0, (n,))
    high = np.broadcast_to(action_spec.maximum if action_spec.maximum is not None else 1.0, (n,))
    centre, half = (low + high) / 2.0, (high - low) / 2.0
    keymap = {KEYBOARD_CENTRE: centre.astype(action_spec.dtype)}
    for i in range(n):
        for keys, sign in ((KEYBOARD_UP, 1.0), (KEYBOARD_DOWN, -1.0)):
            action = centre.copy()
            action[i] += sign * gain * half[i]
            keymap[keys[i]] = action.astype(action_spec.dtype)
    return keymap


def terminal_fd() -> int:
    """The terminal to read keys from: standard input if it is one, else the controlling terminal
    (an actor process started by ``embodyrl train`` has no terminal on its standard input)."""
    if os.isatty(0):
        return 0
    try:
        return os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        raise TeleopError("keyboard: no terminal to read keys from (standard input is not one and "
                          "there is no controlling terminal)") from None


SOURCES = ("keyboard", "gamepad[:PATH]", "spacemouse[:PATH]", "lerobot:TYPE[:key=value,...]",
           "script:module:function")


def check_spec(spec: str) -> None:
    """Refuse a malformed source name (TeleopError) without opening anything."""
    kind, _, rest = spec.partition(":")
    if (kind == "keyboard" and not rest) or kind in LAYOUTS:
        return
    if kind == "script":
        module, _, function = rest.rpartition(":")
        if module and function:
            return
        raise TeleopError(f"teleop {spec!r}: a script is named script:module:function")
    if kind == "lerobot":
        from .teleop_lerobot import parse

        try:
            parse(spec)
        except ValueError as err:
            raise TeleopError(str(err)) from None
        return
    raise TeleopError(f"unknown teleop source {spec!r}; known: {', '.join(SOURCES)}")


def make_source(spec: str, action_spec: ArraySpec, *, fd: int | None = None):
    """The intervention source named by ``spec`` (see the module docstring). ``fd``: the terminal
    a keyboard source reads (default :func:`terminal_fd`)."""
    check_spec(spec)
    kind, _, rest = spec.partition(":")
    if kind == "keyboard":
        return KeyboardTeleop(keyboard_keymap(action_spec), fd=terminal_fd() if fd is None else fd,
                              abort_key=KEYBOARD_ABORT)
    if kind == "script":
        module, _, function = rest.rpartition(":")
        try:
            fn = getattr(import_here(module), function)  # from the working directory too, as a robot file's
        except (ImportError, AttributeError) as err:
            raise TeleopError(f"teleop {spec!r}: {err}") from None
        if not callable(fn):
            raise TeleopError(f"teleop {spec!r}: {module}.{function} is not callable")
        return ScriptSource(fn, action_spec, name=spec)
    if kind == "lerobot":
        from .lerobot import LeRobotError
        from .teleop_lerobot import make

        try:
            return make(spec, action_spec)
        except (LeRobotError, SpecError) as err:
            raise TeleopError(str(err)) from None
    layout = LAYOUTS[kind]
    path = rest or find_device(layout)
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise TeleopError(f"teleop {spec!r}: {err}") from None
    if stat.S_ISCHR(mode):
        return open_device(layout, path, action_spec)
    absinfo, events = read_recording(path)
    return replay(EventTeleop(layout, action_spec, absinfo=absinfo), events)


def lerobot_spec(settings: dict) -> str:
    """A robot file's ``teleop: {lerobot: {...}}`` as a source name (TeleopError if it cannot be one)."""
    from .teleop_lerobot import spec_of

    try:
        return spec_of(settings)
    except ValueError as err:
        raise TeleopError(str(err)) from None


def close_source(source) -> None:
    """Close a source if it has anything to close."""
    close = getattr(source, "close", None)
    if close is not None:
        close()


if __name__ == "__main__":  # python -m embodyrl.hal.teleop record DEVICE OUT SECONDS
    if len(sys.argv) != 5 or sys.argv[1] != "record":
        sys.exit("usage: python -m embodyrl.hal.teleop record /dev/input/eventN OUT.jsonl SECONDS")
    print(record_events(sys.argv[2], sys.argv[3], float(sys.argv[4])), "events")
