"""A LeRobot robot as an embodyrl device.

LeRobot's ``Robot`` (``connect``, ``get_observation``, ``send_action``,
``disconnect``, ``observation_features``, ``action_features``) is wrapped,
not copied: its own driver moves the motors, with its own calibration, and
embodyrl's safety layer, watchdog, e-stop, keys and exactly-once data go
around it (in this process, or in ``python -m embodyrl.hal.robot_server``
on the robot PC).

The specs follow LeRobot's features, in LeRobot's order:

* ``state``: every scalar observation feature (``shoulder_pan.pos``, ...),
  one float32 vector whose elements carry the feature names
  (:attr:`~embodyrl.hal.specs.ArraySpec.names`), as LeRobot's datasets
  keep ``observation.state``;
* one field per array feature at its declared shape: a camera's
  ``(height, width, 3)`` frame is uint8, any other array float32;
* ``action``: every action feature, one float32 vector with the names.

LeRobot carries no joint limits, so the bounds are declared: ``bounds``
maps each action feature to ``[low, high]`` in LeRobot's units (degrees, or
0..100 for a gripper) and a device without one for every action feature is
refused, naming them (a name that is no feature of the robot is refused too). The state carries
no bounds: a joint held at its limit overshoots it a little.

An action is sent once per step; with ``realtime`` the step returns one
control period after the send, with the observation read then, so o_{t+1}
shows what a_t did (LeRobot's own loop reads at the start of the next
period, which is the same instant). The device's safe action holds the arm
where it is: each action element whose name the state has is commanded to
its last observed value, any other (a velocity) to 0 within its bounds.
The watchdog and the e-stop command it; ``reset`` moves to the declared
``home`` pose (by name) over ``home_s`` seconds, or just reads the state
when none is declared (a person resets the scene).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

import numpy as np

from .. import lerobot
from ..device import Device, Health, HoldInPlace
from ..specs import ArraySpec, DictSpec, SpecError

log = logging.getLogger(__name__)

STATE = "state"
ACTION = "action"
IMAGE_CHANNELS = 3


def _is_array(feature) -> bool:
    return isinstance(feature, (tuple, list))


class LeRobotDevice(Device):
    """Any object with LeRobot's ``Robot`` methods (:func:`~embodyrl.hal.lerobot.is_robot`) as a device."""

    holds_in_place = True

    def __init__(self, robot, bounds: Mapping[str, tuple[float, float]], *, control_period_s: float = 0.1,
                 realtime: bool = True, home: Mapping[str, float] | None = None, home_s: float = 2.0,
                 label: str = "device"):
        super().__init__()
        if not lerobot.is_robot(robot):
            raise lerobot.LeRobotError(f"{label}: {type(robot).__name__} lacks LeRobot's Robot methods "
                                       f"({', '.join(lerobot.lacking(robot, lerobot.ROBOT_METHODS))})")
        if not control_period_s > 0:
            raise ValueError(f"control_period_s: must be > 0, got {control_period_s}")
        self.robot, self.label = robot, label
        self.control_period_s, self.realtime, self.home_s = control_period_s, realtime, home_s
        observed, acted = dict(robot.observation_features), dict(robot.action_features)
        self.state_names = tuple(k for k, v in observed.items() if not _is_array(v))
        self.array_fields = {k: tuple(int(d) for d in v) for k, v in observed.items() if _is_array(v)}
        arrays_in_action = [k for k, v in acted.items() if _is_array(v)]
        if arrays_in_action:
            raise lerobot.LeRobotError(f"{label}: action features {arrays_in_action} are arrays; embodyrl drives "
                                       "an action of named numbers")
        if STATE in self.array_fields:
            raise lerobot.LeRobotError(f"{label}: an observation feature is called {STATE!r}, the name of the "
                                       "state vector here")
        self.action_names = tuple(acted)
        bounds = {str(k): tuple(v) for k, v in bounds.items()}
        missing = [n for n in self.action_names if n not in bounds]
        if missing:
            raise lerobot.LeRobotError(
                f"{label}: bounds: missing for {', '.join(missing)}; LeRobot carries no limits, so give "
                "[low, high] for every action feature (in LeRobot's units: degrees, or 0..100 for a gripper)")
        unknown = [n for n in bounds if n not in self.action_names]
        if unknown:
            raise lerobot.LeRobotError(f"{label}: bounds: {', '.join(unknown)} are not action features of this "
                                       f"robot; it acts on {', '.join(self.action_names)}")
        for name, pair in bounds.items():
            if len(pair) != 2 or not all(math.isfinite(float(x)) for x in pair) or pair[0] > pair[1]:
                raise lerobot.LeRobotError(f"{label}: bounds.{name}: expected [low, high], got {list(pair)}")
        low = [float(bounds[n][0]) for n in self.action_names]
        high = [float(bounds[n][1]) for n in self.action_names]
        self.action_spec = ArraySpec(ACTION, (len(self.action_names),), np.float32, low, high, self.action_names)
        # the state carries no bounds: a joint overshoots its commanded limit, and the learner refuses
        # a row outside its spec's bounds
        fields = [ArraySpec(STATE, (len(self.state_names),), np.float32, names=self.state_names)]
        for name, shape in self.array_fields.items():
            image = len(shape) == 3 and shape[-1] == IMAGE_CHANNELS
            fields.append(ArraySpec(name, shape, np.uint8 if image else np.float32,
                                    *((0, 255) if image else (None, None))))
        self.observation_spec = DictSpec(tuple(fields))
        self._hold = HoldInPlace(self.action_spec, self.observation_spec)
        self.home = None
        if home:
            unknown = [n for n in home if n not in self.action_names]
            if unknown:
                raise lerobot.LeRobotError(f"{label}: home: {', '.join(unknown)} are not action features")
            self.home = {n: float(v) for n, v in home.items()}
        self._last: dict[str, np.ndarray] | None = None
        self.sent: dict[str, float] | None = None
        """What the robot's ``send_action`` last reported sending (LeRobot may clip a target itself)."""

    # -- lifecycle -------------------------------------------------------
    def _connect(self) -> None:
        lerobot.connect(self.robot, self.label)

    def _close(self) -> None:
        lerobot.disconnect(self.robot)

    # -- control ---------------------------------------------------------
    def _observe(self) -> dict[str, np.ndarray]:
        raw = self.robot.get_observation()
        missing = [n for n in (*self.state_names, *self.array_fields) if n not in raw]
        if missing:
            raise SpecError(f"{self.label}: the robot's observation lacks {', '.join(missing)}")
        observation = {STATE: np.array([float(raw[n]) for n in self.state_names], np.float32)}
        for name in self.array_fields:
            value = np.asarray(raw[name])
            observation[name] = value.astype(np.float32) if value.dtype.kind == "f" else value
        self._last = observation
        return observation

    def _send(self, action: np.ndarray) -> None:
        sent = self.robot.send_action(dict(zip(self.action_names, action.tolist(), strict=True)))
        self.sent = dict(sent) if isinstance(sent, Mapping) else None

    def _reset(self, seed):
        observation = self._observe()
        if self.home is None:
            return observation
        start = self.hold_action()
        goal = start.copy()
        for i, name in enumerate(self.action_names):
            if name in self.home:
                goal[i] = self.home[name]
        goal = self.action_spec.clip(goal)
        steps = max(1, math.ceil(self.home_s / self.control_period_s))
        for k in range(1, steps + 1):
            observation = self._step((start + (goal - start) * (k / steps)).astype(np.float32))
        return observation

    def _step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        sent_at = time.monotonic()
        self._send(action)
        if self.realtime:
            time.sleep(max(0.0, sent_at + self.control_period_s - time.monotonic()))
        return self._observe()

    def hold_action(self) -> np.ndarray | None:
        """The action that holds the robot where it was last observed (see the module docstring); None
        before the first observation: nothing is known to hold."""
        return None if self._last is None else self._hold(self._last)

    @property
    def safe_action(self) -> np.ndarray | None:
        return self.hold_action()

    def _health(self) -> Health:
        if not self.robot.is_connected:
            return Health("faulted", f"{self.label}: the LeRobot robot reports it is not connected")
        return Health()

    def _on_estop(self) -> None:
        if not self._connected or self._last is None:
            return
        try:
            self._send(self.hold_action())
        except Exception as err:  # noqa: BLE001 - the latch holds whatever the driver says
            log.error("%s: holding the robot on e-stop failed: %s", self.label, err)


def wrap(robot, bounds: Mapping | None, **options) -> LeRobotDevice:
    """``robot`` as a device; without ``bounds`` it is refused, naming every action feature."""
    label = options.get("label", "device")
    if not bounds:
        names = ", ".join(dict(robot.action_features)) if lerobot.is_robot(robot) else "its action features"
        raise lerobot.LeRobotError(f"{label}: a LeRobot robot needs bounds: [low, high] for each of {names} "
                                   "(LeRobot carries no limits; declare them under device.bounds)")
    return LeRobotDevice(robot, bounds, **options)
