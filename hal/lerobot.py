"""LeRobot's robots and teleoperators by type, as LeRobot itself makes them.

A robot file names a LeRobot robot the way LeRobot's own commands do
(``--robot.type=so101_follower --robot.port=/dev/ttyACM0``), as a mapping::

    device:
      lerobot: {type: so101_follower, port: /dev/ttyACM0, id: my_arm,
                cameras: {front: {type: opencv, index_or_path: 0, width: 640, height: 480, fps: 30}}}

:func:`make_robot` turns it into LeRobot's config class (draccus decodes it,
nested camera configs included) and the robot its ``make_robot_from_config``
returns; :func:`make_teleoperator` does the same for teleoperators
(``--teleop lerobot:so101_leader:port=/dev/ttyACM1,id=my_leader``). The types
are those of LeRobot's own tree and of every installed ``lerobot_robot_*``,
``lerobot_camera_*`` and ``lerobot_teleoperator_*`` plugin package, registered
as LeRobot's scripts register them. A type given as ``package.module.callable``
(a dot in it; LeRobot's types have none) is a factory instead, called with the
other keys as keyword arguments: a robot or teleoperator with LeRobot's
methods that is not registered with LeRobot.

LeRobot is imported only here and only when a robot file or a source names it
(``pip install 'embodyrl[lerobot]'``); nothing else in embodyrl needs it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import pkgutil
from collections.abc import Mapping
from functools import reduce

from .plugins import import_here

log = logging.getLogger(__name__)

ROBOT_METHODS = ("observation_features", "action_features", "connect", "disconnect", "get_observation",
                 "send_action", "is_connected")
"""What a LeRobot ``Robot`` has that embodyrl uses; an object with all of them is driven as one."""
TELEOPERATOR_METHODS = ("action_features", "connect", "disconnect", "get_action", "is_connected")
"""The same for a LeRobot ``Teleoperator``."""


class LeRobotError(ValueError):
    """A LeRobot robot or teleoperator that cannot be made or driven here; the message says why."""


def lacking(thing, methods: tuple[str, ...]) -> list[str]:
    """Which of LeRobot's ``methods`` ``thing`` lacks."""
    return [m for m in methods if not hasattr(thing, m)]


def is_robot(thing) -> bool:
    """Whether ``thing`` has LeRobot's ``Robot`` methods (a LeRobot robot, or a class written like one)."""
    return not lacking(thing, ROBOT_METHODS)


def is_teleoperator(thing) -> bool:
    """Whether ``thing`` has LeRobot's ``Teleoperator`` methods."""
    return not lacking(thing, TELEOPERATOR_METHODS) and not hasattr(thing, "send_action")


def _lerobot():
    try:
        import lerobot
    except ImportError as err:
        raise LeRobotError(f"LeRobot is not installed here ({err}): pip install 'embodyrl[lerobot]'") from None
    return lerobot


@functools.cache
def _registered(kind: str) -> tuple[str, ...]:
    """Import every module of ``lerobot.<kind>`` and the installed plugins, so their config classes
    register their types (LeRobot's scripts import them the same way); the modules that would not
    import (a vendor SDK missing) are logged and named in errors."""
    _lerobot()
    from lerobot.utils.import_utils import register_third_party_plugins

    package = importlib.import_module(f"lerobot.{kind}")
    failed = []
    for module in pkgutil.iter_modules(package.__path__):
        try:
            importlib.import_module(f"lerobot.{kind}.{module.name}")
        except Exception as err:  # noqa: BLE001 - a robot whose SDK is missing must not hide the others
            failed.append(f"{module.name} ({type(err).__name__}: {err})")
            log.debug("lerobot.%s.%s did not import: %s", kind, module.name, err)
    register_third_party_plugins()
    return tuple(failed)


def _config(base_name: str, kind: str, settings: Mapping, where: str):
    """LeRobot's config object for ``settings`` (``type`` and the config's fields)."""
    failed = _registered(kind)  # LeRobot first: without it, say how to install it
    import draccus

    module = importlib.import_module(f"lerobot.{kind}")
    base = getattr(module, base_name)
    if settings["type"] not in base.get_known_choices():  # a plugin installed since: look again
        _registered.cache_clear()
        failed = _registered(kind)
    known = sorted(base.get_known_choices())
    if settings["type"] not in known:
        why = f"; modules that did not import: {'; '.join(failed)}" if failed else ""
        raise LeRobotError(f"{where}: LeRobot has no {kind[:-1]} type {settings['type']!r}; known: "
                           f"{', '.join(known)}{why}")
    try:
        return draccus.decode(base, dict(settings))
    except Exception as err:  # noqa: BLE001 - draccus raises several kinds for a field that does not fit
        raise LeRobotError(f"{where}: {settings['type']}: {err}") from None


def _factory(settings: Mapping, where: str):
    """``type: package.module.callable``: the callable, called with the other settings."""
    module, _, attr = settings["type"].rpartition(".")
    try:
        found = reduce(getattr, attr.split("."), import_here(module))
    except (ImportError, AttributeError) as err:
        raise LeRobotError(f"{where}: cannot import {settings['type']!r} ({err})") from None
    options = {k: v for k, v in settings.items() if k != "type"}
    try:
        return found(**options)
    except TypeError as err:
        raise LeRobotError(f"{where}: {settings['type']}: {err}") from None


def _checked(settings, where: str) -> Mapping:
    if not isinstance(settings, Mapping) or not isinstance(settings.get("type"), str) or not settings["type"]:
        raise LeRobotError(f"{where}: expected a mapping with a type (for example so101_follower), got {settings!r}")
    return settings


_KINDS = {
    "robots": ("RobotConfig", "make_robot_from_config", is_robot, ROBOT_METHODS, "Robot"),
    "teleoperators": ("TeleoperatorConfig", "make_teleoperator_from_config", is_teleoperator,
                      TELEOPERATOR_METHODS, "Teleoperator"),
}


def _make(kind: str, settings: Mapping, where: str):
    """What LeRobot's ``make_*_from_config`` makes of ``settings`` (or a factory's answer), checked."""
    base, maker, fits, methods, label = _KINDS[kind]
    settings = _checked(settings, where)
    if "." in settings["type"]:
        made = _factory(settings, where)
    else:
        config = _config(base, kind, settings, where)
        try:
            made = getattr(importlib.import_module(f"lerobot.{kind}"), maker)(config)
        except Exception as err:  # noqa: BLE001 - a vendor SDK's own error, named
            raise LeRobotError(f"{where}: {settings['type']}: {type(err).__name__}: {err}") from None
    if not fits(made):
        raise LeRobotError(f"{where}: {settings['type']} made a {type(made).__name__}, which lacks LeRobot's "
                           f"{label} methods ({', '.join(lacking(made, methods)) or 'get_action'})")
    return made


def make_robot(settings: Mapping, where: str = "device.lerobot"):
    """The LeRobot robot ``settings`` describe (not connected); LeRobotError naming what is wrong."""
    return _make("robots", settings, where)


def make_teleoperator(settings: Mapping, where: str = "teleop"):
    """The LeRobot teleoperator ``settings`` describe (not connected)."""
    return _make("teleoperators", settings, where)


def connect(thing, what: str) -> None:
    """Connect without calibrating: LeRobot's own calibration stays as its tools left it. One not
    calibrated is disconnected again and refused, naming the command that calibrates it."""
    takes_calibrate = "calibrate" in inspect.signature(thing.connect).parameters
    try:
        thing.connect(calibrate=False) if takes_calibrate else thing.connect()
    except Exception:
        disconnect(thing)
        raise
    if getattr(thing, "is_calibrated", True) is False:
        disconnect(thing)
        kind = "robot" if hasattr(thing, "send_action") else "teleop"
        raise LeRobotError(f"{what} is not calibrated; calibrate it with LeRobot's own tool first: "
                           f"lerobot-calibrate --{kind}.type=... --{kind}.port=... --{kind}.id={getattr(thing, 'id', '...')}")


def disconnect(thing) -> None:
    """Disconnect if connected; an error on the way out is logged, never raised over the one that led here."""
    try:
        if thing.is_connected:
            thing.disconnect()
    except Exception as err:  # noqa: BLE001
        log.error("%s: disconnect failed: %s", type(thing).__name__, err)
