"""The safety layer: a :class:`Device` wrapper that filters every action.

``SafeDevice(device, SafetyConfig(...))`` is itself a device (it passes
:class:`~embodyrl.hal.testing.DeviceConformance`), so it composes around any
driver, a group or another wrapper. On each ``step(proposed)`` it, in order:

1. clips the action to the action spec's bounds            (``clipped``)
2. limits its change from the last applied action           (``rate_limited``)
3. asks the workspace limit about the current observation;
   outside the limits it commands the limit's safe action    (``workspace``)

and then applies it. A watchdog thread commands the safe action whenever no
step arrives within ``watchdog_s`` (``watchdog``). Workspace violations,
watchdog firings and driver errors are *faults*; ``estop_after_faults`` of
them in a row (no clean step between) latch the e-stop (``estop``). Every
intervention is counted by kind in :attr:`SafeDevice.interventions`; the
action actually applied is :attr:`SafeDevice.last_applied`, which the actor
loop records next to the policy's proposal.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .device import Device, EStopError, Health
from .specs import SpecError
from .watchdog import Watchdog

# Given o_t and the action about to be applied: None to allow it, or the
# action to apply instead (e.g. the safe action when o_t is out of bounds).
WorkspaceLimit = Callable[[dict[str, np.ndarray], np.ndarray], "np.ndarray | None"]

KINDS = ("clipped", "rate_limited", "workspace", "watchdog", "estop", "device_error")


@dataclass(frozen=True)
class BoxLimit:
    """A workspace or joint limit: ``observation[field]`` must stay in [low, high].

    Outside the box it returns ``safe_action`` (or None, meaning the safety
    layer's own safe action). Use ``field="ee_pos"`` for a Cartesian box,
    ``field="qpos"`` for joint limits.
    """

    field: str
    """Observation field to check."""
    low: tuple[float, ...] | float
    """Inclusive lower bound, one value or one per element."""
    high: tuple[float, ...] | float
    """Inclusive upper bound, one value or one per element."""
    safe_action: tuple[float, ...] | None = None
    """Action to command outside the box; None: ``SafetyConfig.safe_action``."""

    def __call__(self, observation, action):
        value = observation[self.field]
        if np.all(value >= self.low) and np.all(value <= self.high):
            return None
        return _SAFE if self.safe_action is None else np.asarray(self.safe_action)


_SAFE = np.zeros(0)  # sentinel: "use the configured safe action"


@dataclass(frozen=True)
class SafetyConfig:
    """What the safety layer enforces; every limit is optional but clipping."""

    max_delta: float | tuple[float, ...] | None = None
    """Largest change of each action element per control step; None: no rate limit."""
    workspace: WorkspaceLimit | None = None
    """Called with (o_t, action) before applying; returns None or the action to apply."""
    safe_action: tuple[float, ...] | None = None
    """What to command on a watchdog timeout or workspace violation; None: zeros clipped to the spec."""
    watchdog_s: float | None = None
    """Command the safe action if no step arrives for this long; None: no watchdog."""
    estop_after_faults: int = 3
    """Consecutive faults (watchdog, workspace, driver error) that latch the e-stop; 0: never."""


class SafeDevice(Device):
    """A device whose every action passes the limits of a :class:`SafetyConfig`."""

    def __init__(self, device: Device, config: SafetyConfig = SafetyConfig()):
        super().__init__()
        self.inner = device
        self.config = config
        self.observation_spec = device.observation_spec
        self.action_spec = spec = device.action_spec
        self.control_period_s = device.control_period_s
        self._low, self._high = spec.limits
        self._bounded = bool(np.isfinite(self._low).any() or np.isfinite(self._high).any())
        self._dtype = spec.dtype
        self._direct = type(device).step is Device.step
        self._configured_safe = None if config.safe_action is None else self._safe_action(config.safe_action)
        self._default_safe = self._safe_action(None)
        self._max_delta = None
        if config.max_delta is not None:
            delta = np.broadcast_to(np.asarray(config.max_delta, np.float64), spec.shape)
            if not (delta > 0).all():
                raise ValueError(f"max_delta: must be > 0 for every element, got {config.max_delta}")
            self._max_delta = delta.astype(spec.dtype)
        if config.watchdog_s is not None and config.watchdog_s <= 0:
            raise ValueError(f"watchdog_s: must be > 0, got {config.watchdog_s}")
        if config.estop_after_faults < 0:
            raise ValueError(f"estop_after_faults: must be >= 0, got {config.estop_after_faults}")
        self.interventions: dict[str, int] = dict.fromkeys(KINDS, 0)
        """Interventions by kind since construction (never reset: they are run totals)."""
        self.last_applied: np.ndarray | None = None
        """The action the safety layer last sent to the device (None after reset)."""
        self.last_observation: dict[str, np.ndarray] | None = None
        self.consecutive_faults = 0
        self._lock = threading.Lock()
        self._last_step = 0.0
        self._watchdog = (Watchdog(config.watchdog_s, self._on_watchdog, name="safety-watchdog")
                          if config.watchdog_s is not None else None)

    def _safe_action(self, value) -> np.ndarray:
        spec = self.action_spec
        if value is None:
            return np.clip(np.zeros(spec.shape), self._low, self._high).astype(spec.dtype)
        action = np.asarray(value, np.float64)
        if action.shape != spec.shape:
            raise ValueError(f"safe_action: shape {action.shape} where {spec.shape} was expected")
        if (action < self._low).any() or (action > self._high).any():
            raise ValueError(f"safe_action: {action.tolist()} is outside the action bounds")
        return action.astype(spec.dtype)

    @property
    def safe_action(self) -> np.ndarray:
        """``SafetyConfig.safe_action``; else, for a device that holds in place (a position-controlled
        robot: :class:`~.device.HoldInPlace`), its hold where it is now, not zero; else zeros clipped
        into the bounds. None for a device that holds in place but has not been observed yet (nothing
        is known to hold, and zero may be far from where it stands)."""
        if self._configured_safe is not None:
            return self._configured_safe
        if self.inner.holds_in_place:
            held = self.inner.hold_action()
            return None if held is None else np.asarray(held, self._dtype)
        return self._default_safe

    @property
    def holds_in_place(self) -> bool:
        return self._configured_safe is None and self.inner.holds_in_place

    def hold_action(self) -> np.ndarray:
        return self.safe_action

    # -- lifecycle -------------------------------------------------------
    def _connect(self) -> None:
        self.inner.connect()
        if self._watchdog is not None:
            self._watchdog.start()

    def _close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        with self._lock:
            self.inner.close()

    # -- control ---------------------------------------------------------
    def _reset(self, seed):
        if self._watchdog is not None:
            self._watchdog.disarm()
        with self._lock:
            observation = self.inner.reset(seed)
            self._last_step = time.monotonic()  # a watchdog firing racing the reset stands down
            self.last_applied = None
            self.last_observation = observation
            return observation

    def step(self, action) -> dict[str, np.ndarray]:
        """Filter ``action`` through the limits, apply it, return the next observation.

        The proposed action is checked like any device action (shape, finite)
        and raises :class:`SpecError` when malformed; the observation is
        validated against the spec. This path runs every control period, so
        it uses ufuncs and byte comparisons rather than numpy reductions
        (each reduction costs about a microsecond here).
        """
        self._require_ready()
        spec = self.action_spec
        action = np.asarray(action)
        if action.shape != spec.shape:
            raise SpecError(f"{spec.name}: shape {action.shape} where {spec.shape} was expected")
        if action.dtype.kind not in "biuf" or not (
                math.isfinite(sum(action.ravel().tolist())) or np.isfinite(action).all()):
            raise SpecError(f"{spec.name}: non-finite or non-numeric value in {action.tolist()}")
        return self._step(action.astype(spec.dtype, copy=False))

    def _step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        counts = self.interventions
        if self._bounded:
            clipped = np.minimum(np.maximum(action, self._low), self._high).astype(self._dtype)
            if clipped.tobytes() != action.tobytes():
                counts["clipped"] += 1
                action = clipped
        with self._lock:
            if self._estop_reason is not None:  # latched by the watchdog since we checked
                raise EStopError(f"{type(self).__name__} is e-stopped ({self._estop_reason})")
            fault = False
            previous = self.last_applied
            if self._max_delta is not None and previous is not None:
                limited = np.minimum(np.maximum(action, previous - self._max_delta),
                                     previous + self._max_delta)
                if limited.tobytes() != action.tobytes():
                    counts["rate_limited"] += 1
                    action = limited
            if self.config.workspace is not None and self.last_observation is not None:
                override = self.config.workspace(self.last_observation, action)
                if override is not None:
                    counts["workspace"] += 1
                    action = self.safe_action if override is _SAFE else self._safe_action(override)
                    fault = True
            try:
                observation = self._apply(action)
            except EStopError:
                raise
            except Exception:
                counts["device_error"] += 1
                self._fault("driver error")
                raise
            self.last_applied = action
            self.last_observation = observation
            self._last_step = time.monotonic()
            if fault:
                self._fault("workspace limit")
            else:
                self.consecutive_faults = 0
        if self._watchdog is not None:
            self._watchdog.kick()
        return observation

    def _apply(self, action: np.ndarray) -> dict[str, np.ndarray]:
        """Step the wrapped device with an action already checked and limited here.

        A driver that keeps the base class's ``step`` gets the action
        directly (its e-stop latch still applies; the observation is still
        validated); any other device goes through its own ``step``.
        """
        inner = self.inner
        if not self._direct:
            return inner.step(action)
        inner._require_ready()
        return inner.observation_spec.validate(inner._step(action))

    def _on_watchdog(self) -> None:
        with self._lock:
            stale = time.monotonic() - self._last_step >= self.config.watchdog_s * 0.999
            if not stale or self.estopped or not self._connected:
                return
            self.interventions["watchdog"] += 1
            try:
                safe = self.safe_action
                if safe is not None:
                    self.last_observation = self.inner.step(safe)
                    self.last_applied = safe
            except EStopError:
                pass
            finally:
                self._fault("watchdog: no action within the deadline")

    def _fault(self, reason: str) -> None:
        """Count a fault (lock held); latch the e-stop after too many in a row."""
        self.consecutive_faults += 1
        limit = self.config.estop_after_faults
        if limit and self.consecutive_faults >= limit and not self.estopped:
            self.estop(f"{self.consecutive_faults} consecutive faults, last: {reason}")

    # -- health and e-stop -----------------------------------------------
    def _health(self) -> Health:
        inner = self.inner.health()
        if inner.status != "ok":
            return inner
        if self.consecutive_faults:
            return Health("degraded", f"{self.consecutive_faults} consecutive safety faults")
        return inner

    def _on_estop(self) -> None:
        self.interventions["estop"] += 1
        if self._watchdog is not None:
            self._watchdog.disarm()
        self.inner.estop(self._estop_reason or "e-stop")

    @property
    def estopped(self) -> bool:
        """Latched here, or on the wrapped device (a robot server's latch, an admin's among them,
        that this process did not set): the page and the actor's status must show both."""
        return self._estop_reason is not None or self.inner.estopped

    def clear_estop(self) -> None:
        """Clear the latch here and on the wrapped device; fault counts start over."""
        self.inner.clear_estop()
        self.consecutive_faults = 0
        super().clear_estop()
