"""The device protocol: anything the actor loop can drive.

A device is a robot, a simulation or a coupled model seen through one small
interface. It knows its specs, resets, applies one action per control period
and reports its health; it does not know rewards (those belong to the task,
so one robot serves many tasks). The loop it expects::

    with device:                      # connect() ... close()
        obs = device.reset(seed)
        while running:
            obs = device.step(action) # one control period
            if device.health().status == "faulted": ...

An e-stop latches: once raised, ``step`` refuses to move the hardware until
``clear_estop()`` is called explicitly.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import numpy as np

from .specs import ArraySpec, DictSpec, SpecError

HealthStatus = Literal["ok", "degraded", "faulted"]


@dataclass(frozen=True)
class Health:
    status: HealthStatus = "ok"
    reason: str = ""


class EStopError(RuntimeError):
    """The device is e-stopped; it will not move until the e-stop is cleared."""


class EpisodeInterrupted(RuntimeError):
    """The device ended the episode on its own and wants a reset before the next step.

    A robot server's watchdog does this when the actor paused for longer than
    its period (a learner compiling, a credit wait): the robot is already in
    its safe state, so the actor loop resets and goes on instead of failing.
    """


class HoldInPlace:
    """The action that holds a position-controlled robot where it is: each action element named like an
    element of the observation's ``state`` vector is commanded to that element's value, any other, and
    any velocity (a name ending in ``.vel``, LeRobot's convention), to 0 within its bounds. Built from
    the specs' element names, so a robot server and the actor across the network compute the same hold."""

    field = "state"
    velocity_suffix = ".vel"

    def __init__(self, action_spec: ArraySpec, observation_spec: DictSpec):
        state = observation_spec.get(self.field)
        if action_spec.names is None or state is None or state.names is None:
            raise SpecError(f"holding in place needs named action elements and a named {self.field!r} vector")
        self.action_spec = action_spec
        self._source = np.array([state.names.index(n) if n in state.names and not n.endswith(self.velocity_suffix)
                                 else -1 for n in action_spec.names])

    def __call__(self, observation: Mapping[str, np.ndarray]) -> np.ndarray:
        state = np.asarray(observation[self.field], np.float64)
        held = np.where(self._source >= 0, state[np.maximum(self._source, 0)], 0.0)
        return self.action_spec.clip(held)


def hold_safe(device) -> dict[str, np.ndarray] | None:
    """One control period of the device's safe action, if it declares one and is not e-stopped
    (a watchdog sees clean steps, the robot stays put while a person resets or answers); the
    observation it returned, else None."""
    if getattr(device, "safe_action", None) is not None and not device.estopped:
        return device.step(device.safe_action)
    return None


class Device(abc.ABC):
    """Base class of every driver. Subclasses implement the ``_``-prefixed hooks.

    Three optional attributes have defaults here, so the actor loop reads them from any device:
    a device that filters actions (the safety layer) overrides them.
    """

    observation_spec: DictSpec
    action_spec: ArraySpec
    control_period_s: float

    last_applied: np.ndarray | None = None
    """The action the last ``step`` really applied, where the device changes commands (clipping,
    rate limits); None: the command is applied as given (clipped to the spec by the actor loop)."""
    safe_action: np.ndarray | None = None
    """What to command to hold the device safe while the actor pauses (None: nothing to command)."""

    holds_in_place: bool = False
    """Whether the safe action holds the robot where it is (``hold_action()``, a position-controlled arm:
    :class:`HoldInPlace`) rather than a fixed action; the safety layer and a robot server ask."""

    interventions: Mapping[str, int] = MappingProxyType({})
    """Commands the device changed, by kind (the safety layer counts them; default: none)."""

    def __init__(self) -> None:
        self._estop_reason: str | None = None
        self._connected = False

    # -- lifecycle -------------------------------------------------------
    def connect(self) -> None:
        if not self._connected:
            self._connect()
            self._connected = True

    def close(self) -> None:
        if self._connected:
            self._connected = False
            self._close()

    def __enter__(self) -> Device:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- control ---------------------------------------------------------
    def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
        """Bring the device to an initial state and return o_0."""
        self._require_ready()
        return self.observation_spec.validate(self._reset(seed))

    def step(self, action) -> dict[str, np.ndarray]:
        """Apply ``action`` for one control period and return the next observation.

        The action must have the spec's shape and be finite (it is cast to the
        spec's dtype); the observation the driver returns is validated too, so
        a driver fault surfaces as a :class:`SpecError` naming the field.
        """
        self._require_ready()
        spec = self.action_spec
        action = np.asarray(action)
        if action.shape != spec.shape:
            raise SpecError(f"{spec.name}: shape {action.shape} where {spec.shape} was expected")
        if action.dtype.kind not in "biuf" or not np.isfinite(action).all():
            raise SpecError(f"{spec.name}: non-finite or non-numeric value in {action.tolist()}")
        return self.observation_spec.validate(self._step(action.astype(spec.dtype, copy=False)))

    def health(self) -> Health:
        if self._estop_reason is not None:
            return Health("faulted", f"e-stop: {self._estop_reason}")
        return self._health()

    def estop(self, reason: str) -> None:
        """Latch an emergency stop and command the device's safe state."""
        if self._estop_reason is None:
            self._estop_reason = reason
            self._on_estop()

    def clear_estop(self) -> None:
        self._estop_reason = None

    @property
    def estopped(self) -> bool:
        return self._estop_reason is not None

    def _require_ready(self) -> None:
        if not self._connected:
            raise RuntimeError(f"{type(self).__name__} is not connected: call connect() first")
        if self._estop_reason is not None:
            raise EStopError(f"{type(self).__name__} is e-stopped ({self._estop_reason}); clear_estop() first")

    # -- driver hooks ----------------------------------------------------
    def _connect(self) -> None:
        """Open the link to the hardware (default: nothing to do)."""

    def _close(self) -> None:
        """Release the hardware (default: nothing to do)."""

    @abc.abstractmethod
    def _reset(self, seed: int | None) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def _step(self, action: np.ndarray) -> dict[str, np.ndarray]: ...

    def _health(self) -> Health:
        return Health()

    def _on_estop(self) -> None:
        """Command the safe state (default: nothing; real drivers must override)."""
