"""A LeRobot teleoperator as the person's input: a leader arm, a gamepad, a phone, any plugin.

``--teleop lerobot:TYPE[:key=value,...]`` (``lerobot:so101_leader:port=/dev/ttyACM1,id=my_leader``)
makes the teleoperator LeRobot's own way (:func:`~embodyrl.hal.lerobot.make_teleoperator`), connects
it without calibrating, and maps its action onto the device's action **by name**: every element of
the device's action (:attr:`~embodyrl.hal.specs.ArraySpec.names`, a LeRobot robot's
``shoulder_pan.pos``, ...) must be one of the teleoperator's action features and every feature one
of the device's, or the source is refused, naming them.

When the person has control:

* a teleoperator with ``get_teleop_events()`` (LeRobot's gamepad and keyboard) says so itself
  (``is_intervention``); its ``rerecord_episode`` throws the episode away;
* any other (a leader arm, which always reports where it is) has control from the moment it moves
  by more than ``deadband`` of an element's range until it has been still for ``release_s``: a
  person who lets go of the leader hands the robot back to the policy.

The device's safety layer still bounds what the person commands.
"""

from __future__ import annotations

import math
import time

import numpy as np

from . import lerobot
from .intervention import EpisodeAborted
from .specs import ArraySpec, SpecError

PREFIX = "lerobot:"
IS_INTERVENTION, RERECORD = "is_intervention", "rerecord_episode"


class LeRobotTeleop:
    """The intervention source over one LeRobot teleoperator (see the module docstring)."""

    def __init__(self, teleop, action_spec: ArraySpec, *, deadband: float = 0.02, release_s: float = 1.0,
                 label: str = "teleop"):
        if action_spec.names is None:
            raise SpecError(f"{label}: a LeRobot teleoperator's action is matched by name, and this device's "
                            f"action elements have none (a LeRobot robot's do)")
        features = list(dict(teleop.action_features))
        missing = [n for n in action_spec.names if n not in features]
        extra = [n for n in features if n not in action_spec.names]
        if missing or extra:
            raise SpecError(f"{label}: its action does not fit the device's: "
                            + "; ".join(part for part in (
                                f"the device's {', '.join(missing)} not given" if missing else "",
                                f"{', '.join(extra)} not the device's" if extra else "") if part)
                            + f" (the device acts on {', '.join(action_spec.names)})")
        self.teleop, self.action_spec, self.label = teleop, action_spec, label
        low, high = action_spec.limits
        span = np.where(np.isfinite(high - low), high - low, 1.0)
        self.threshold = deadband * span
        self.release_s = release_s
        self._events = getattr(teleop, "get_teleop_events", None)
        self._rest: np.ndarray | None = None
        self._until = -math.inf
        lerobot.connect(teleop, label)

    def _action(self) -> np.ndarray:
        raw = self.teleop.get_action()
        try:
            action = np.array([float(raw[n]) for n in self.action_spec.names], np.float64)
        except KeyError as err:
            raise SpecError(f"{self.label}: its action lacks {err.args[0]!r}") from None
        if not np.isfinite(action).all():
            raise SpecError(f"{self.label}: non-finite value in its action {action.tolist()}")
        return action.astype(self.action_spec.dtype)

    def poll(self, observation=None) -> np.ndarray | None:
        action = self._action()
        if self._events is not None:
            events = {getattr(k, "value", k): v for k, v in (self._events() or {}).items()}
            if events.get(RERECORD):
                raise EpisodeAborted(f"{self.label}: re-record asked")
            return action if events.get(IS_INTERVENTION) else None
        now = time.monotonic()
        if self._rest is None:
            self._rest = action
        elif (np.abs(action - self._rest) > self.threshold).any():
            self._rest, self._until = action, now + self.release_s
        return action if now < self._until else None

    def new_episode(self) -> None:
        self._rest, self._until = None, -math.inf

    def close(self) -> None:
        lerobot.disconnect(self.teleop)


def parse(spec: str) -> dict:
    """``lerobot:TYPE[:key=value,...]`` -> LeRobot settings (values read as YAML scalars)."""
    import yaml

    body = spec[len(PREFIX):]
    kind, _, options = body.partition(":")
    if not kind:
        raise ValueError(f"teleop {spec!r}: name a LeRobot teleoperator type, lerobot:TYPE[:key=value,...]")
    settings: dict = {"type": kind}
    for item in filter(None, options.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"teleop {spec!r}: {item!r} is not key=value")
        settings[key] = yaml.safe_load(value) if value else ""
    return settings


def spec_of(settings: dict) -> str:
    """The ``--teleop`` form of LeRobot settings (a robot file's ``teleop: {lerobot: {...}}``)."""
    options = []
    for key, value in settings.items():
        if key == "type":
            continue
        if isinstance(value, (dict, list)) or any(c in str(value) for c in ",="):
            raise ValueError(f"{key}: only plain values (no mappings, lists, ',' or '=') reach a teleoperator")
        options.append(f"{key}={'true' if value is True else 'false' if value is False else value}")
    return f"{PREFIX}{settings['type']}" + (":" + ",".join(options) if options else "")


def make(spec: str, action_spec: ArraySpec) -> LeRobotTeleop:
    """The source ``spec`` names, connected."""
    teleop = lerobot.make_teleoperator(parse(spec), f"teleop {spec!r}")
    return LeRobotTeleop(teleop, action_spec, label=f"teleop {spec!r}")
