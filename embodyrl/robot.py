"""Robots: what a run drives, named on the command line in one of four ways.

``load(source)`` turns what the user typed where a task is taken (``embodyrl
train``, ``learner``, ``actor``, ``eval``, ``export``, ``record``) into a
:class:`Robot`:

* a built-in task name or ``gym:ID`` (:mod:`embodyrl.envs`), as before;
* ``module:factory``: a callable returning ``(device, task)`` as
  :func:`embodyrl.envs.make` does;
* a robot file, ``*.yaml`` or ``*.yml``, that declares the device (a
  factory, or a :class:`~embodyrl.hal.drivers.remote.RemoteDevice` endpoint
  with its CurveZMQ keys), the task (a factory, or a reward of
  :class:`~embodyrl.hal.rewards.Shaped` terms and
  :class:`~embodyrl.hal.rewards.Success` conditions), the control rate and
  episode length, the reset mode, the safety limits, the camera fields and,
  for a joint-space arm, end-effector actions (``end_effector:``, through
  :class:`~embodyrl.hal.end_effector.EndEffectorDevice`)
  (docs/robots.md shows a complete one, ``examples/robots/arm.yaml``), or a
  learnt success classifier of camera frames (``task.reward: classifier:DIR``,
  written by ``embodyrl reward train``; :class:`ClassifierTask`);
* any of these joined by ``+``: one policy over devices of different shapes.

A bad robot file is refused by :func:`load` with a :class:`RobotFileError`
naming the field (``robot.yaml: task.reward.terms[1].weight: expected a
number, got 'x'``); what only the device's specs can tell (a reward that reads
a field the robot does not observe) is refused by :meth:`Robot.layout`, which
the command line calls before anything starts.

A run keeps :meth:`Robot.record` in ``config.json`` (``robot``): the source,
each robot file's absolute path, content hash and declaration (and its
classifier's directory and file hashes), and the device kinds' specs.
:func:`of_config` rebuilds the robot from it for ``--resume``, ``eval`` and
``export`` (a robot file or a classifier changed since is refused, naming
what changed), and :func:`layout_of` gives the learner its layout without
reaching the robot, and :func:`reward_bounds_of` each device kind's reward bound
(``task.reward_bound`` in a robot file, a built-in task's own, else
:data:`~embodyrl.hal.steps.REWARD_BOUND`): the learner refuses a row whose
|reward| exceeds it. Nothing here imports JAX.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import reduce
from pathlib import Path

import numpy as np

from . import envs
from .hal.classifier import FILES as CLASSIFIER_FILES
from .hal.classifier import ClassifierError, SuccessClassifier, load_classifier
from .hal.device import Device
from .hal.layout import DeviceKind, Layout
from .hal.plugins import import_here
from .hal.rewards import LearnedReward, RewardTask, Shaped, Success, Term, distance, within_distance
from .hal.safety import BoxLimit, SafeDevice, SafetyConfig
from .hal.specs import ArraySpec, DictSpec
from .hal.steps import REWARD_BOUND
from .hal.task import Task

SUFFIXES = (".yaml", ".yml")
"""A source ending in one of these is a robot file."""
RESET_MODES = ("auto", "operator")
"""``auto``: the device resets itself between episodes; ``operator``: a person resets the scene."""
ACTION = "action"
"""In a reward term, the action a_t rather than an observation field."""
CLASSIFIER = "classifier:"
"""``task.reward: classifier:DIR``: the reward is a success classifier's verdict."""
PERSON = "person"
"""``task.reward: person``: the reward is the person's success label at each episode's end."""

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class RobotFileError(ValueError):
    """A robot that cannot be built as declared; the message names the file and the field."""


@dataclass(frozen=True)
class _Part:
    """One device kind of a robot: how to build it and what its file declared."""

    name: str
    source: str
    build: Callable[[], tuple[Device, Task]]
    builtin: bool = False
    reset: str = "auto"
    cameras: tuple[str, ...] = ()
    realtime: bool | None = None
    fields: tuple[tuple[str, str], ...] = ()
    """(where in the file, observation field) for every field the file names, checked against the specs."""
    images: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    """(where, field, HxWxC) of every camera image a classifier reads: the field must be uint8 of that shape."""
    reward_only: tuple[str, ...] = ()
    file: dict | None = None
    """A robot file's ``path``, ``sha256`` and ``declaration`` (and ``classifier``: its ``path`` and
    ``sha256`` by file name)."""
    reward_bound: float = REWARD_BOUND
    """The largest |reward| its task pays (``task.reward_bound``, or a built-in task's own)."""
    teleop: str = ""
    """The person's input device the file names (``teleop:``, a ``--teleop`` source); empty: none."""
    dataset_features: tuple[tuple[str, str], ...] = ()
    """(observation field, LeRobot feature) where a LeRobotDataset names a field otherwise (``dataset_features``)."""


@dataclass(frozen=True)
class Robot:
    """What a run drives: one device kind per part of ``source``, each with its task."""

    source: str
    """What the user gave: a task name, ``gym:ID``, ``module:factory``, a file path, or several joined by ``+``."""
    reset: str = "auto"
    """``auto`` or ``operator`` (a person resets the scene and labels the episode)."""
    camera_fields: tuple[str, ...] = ()
    """Observation fields that are camera images (HxWxC uint8); the encoders read them."""
    reward_only: tuple[str, ...] = ()
    """Observation fields only the reward reads (a classifier's camera); no network reads them."""
    parts: tuple[_Part, ...] = field(default=(), repr=False)
    recorded_layout: Layout | None = field(default=None, repr=False, compare=False)
    """The layout a run recorded (:func:`of_config`); used instead of building the devices."""

    @property
    def names(self) -> tuple[str, ...]:
        """The device kinds' names, in device-id order."""
        return tuple(part.name for part in self.parts)

    @property
    def teleop(self) -> str:
        """The teleop source a robot file names (``--teleop`` overrides it); empty: none."""
        return next((part.teleop for part in self.parts if part.teleop), "")

    @property
    def builtin(self) -> bool:
        """Whether every part is a built-in task or ``gym:ID`` (nothing to record)."""
        return all(part.builtin for part in self.parts)

    def make(self, name: str | None = None) -> tuple[Device, Task]:
        """A new ``(device, task)`` for device kind ``name`` (None: the only kind).

        A robot file's device comes wrapped in :class:`~embodyrl.hal.safety.SafeDevice` with its
        safety limits, pacing at its ``control.rate_hz``; a remote device is connected already
        (its specs come from the robot server), and closing the wrapper releases it."""
        if name is None:
            if len(self.parts) != 1:
                raise ValueError(f"{self.source!r} has several device kinds; name one of {', '.join(self.names)}")
            return self.parts[0].build()
        for part in self.parts:
            if part.name == name:
                return part.build()
        raise ValueError(f"{self.source!r} has no device kind {name!r}; kinds: {', '.join(self.names)}")

    def layout(self) -> Layout:
        """The device kinds and their specs (:class:`~embodyrl.hal.layout.Layout`).

        Builds each device to read its specs (a remote one connects for it) and checks every
        observation field the robot file names; a failure raises :class:`RobotFileError`."""
        if self.recorded_layout is not None:
            return self.recorded_layout
        if self.builtin:
            return envs.layout(self.source)
        return Layout(tuple(_kind(part) for part in self.parts))

    def reward_bounds(self) -> tuple[float, ...]:
        """Each device kind's reward bound, in device-id order (what the learner refuses beyond)."""
        return tuple(part.reward_bound for part in self.parts)

    def record(self) -> dict:
        """What ``config.json`` keeps under ``robot`` (empty for built-in tasks: the name says it all)."""
        if self.builtin:
            return {}
        files = {part.source: part.file for part in self.parts if part.file is not None}
        record: dict = {"source": self.source}
        if files:
            record["files"] = files
        record["layout"] = [{"name": kind.name, "observation_spec": kind.observation_spec.to_msg(),
                             "action_spec": kind.action_spec.to_msg(), "reward_bound": bound}
                            for kind, bound in zip(self.layout().kinds, self.reward_bounds(), strict=True)]
        return record

    def config_defaults(self) -> dict:
        """Run settings the robot implies (a config mapping, merged under the user's): ``actor.realtime``
        from ``control.realtime``, ``actor.reset`` from ``reset``, and the encoders' ``image_fields``
        from the camera fields and ``ignore_fields`` from the reward-only fields."""
        defaults: dict = {}
        realtime = [part.realtime for part in self.parts if part.realtime is not None]
        if realtime:  # declared in a robot file
            defaults["actor"] = {"realtime": any(realtime), "reset": self.reset}
        if self.teleop:
            defaults.setdefault("actor", {})["teleop"] = self.teleop
        features = dict(f for part in self.parts for f in part.dataset_features)
        if features:
            defaults["learner"] = {"demos_features": features}
        encoder = {key: list(fields) for key, fields in (("image_fields", self.camera_fields),
                                                         ("ignore_fields", self.reward_only)) if fields}
        if encoder:
            from .algos import registry

            for section, kind in registry.sections().items():
                if "encoder" in kind.__dataclass_fields__:
                    defaults[section] = {"encoder": dict(encoder)}
        return defaults


# -- every form of source -----------------------------------------------------------

def is_file(source: str) -> bool:
    """Whether ``source`` names a robot file (by its suffix)."""
    return source.lower().endswith(SUFFIXES)


def load(source: str) -> Robot:
    """The robot ``source`` names, in any form; :class:`RobotFileError` naming what is wrong."""
    return _load(source, {})


def _load(source: str, recorded: dict[str, dict]) -> Robot:
    """:func:`load`, with ``recorded``: absolute path -> the file record of a robot file that is gone."""
    if not isinstance(source, str) or not source.strip():
        raise RobotFileError("no robot given: name a task, gym:ID, module:factory or a robot file (*.yaml)")
    if envs.is_known(source):  # built-in tasks, as before
        return Robot(source, parts=tuple(_load_part(name, recorded) for name in envs.parts(source)))
    pieces = envs.parts(source) if envs.SEPARATOR in source and not Path(source).is_file() else (source,)
    if not all(pieces):
        raise RobotFileError(f"{source!r}: a part between the {envs.SEPARATOR} signs is empty")
    parts = tuple(_load_part(piece, recorded) for piece in pieces)
    names = [part.name for part in parts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RobotFileError(f"{source!r} names device kind {twice[0]!r} twice (more copies of one device: "
                             "more actors; another robot file: give it another name:)")
    resets = sorted({part.reset for part in parts})
    if len(resets) > 1:
        raise RobotFileError(f"{source!r}: its robot files declare different reset modes ({', '.join(resets)}); "
                             "one run resets all its devices one way")
    cameras = tuple(dict.fromkeys(c for part in parts for c in part.cameras))
    reward_only = tuple(dict.fromkeys(f for part in parts for f in part.reward_only))
    return Robot(source, reset=resets[0], camera_fields=cameras, reward_only=reward_only, parts=parts)


def _builtin(name: str):
    return lambda: envs.make(name)


def _load_part(source: str, recorded: dict[str, dict]) -> _Part:
    if envs.is_known(source):
        return _Part(source, source, _builtin(source), builtin=True, reward_bound=envs.reward_bound(source))
    if is_file(source):
        return _load_file(source, recorded.get(source))
    if _FACTORY.match(source) and not source.startswith(envs.GYM_PREFIX):
        factory = _import(source, source)
        return _Part(source, source, lambda: _checked_pair(factory(), source))
    if source.startswith(envs.GYM_PREFIX) or envs.SEPARATOR in source:
        raise RobotFileError(envs.unknown_reason(source))
    raise RobotFileError(envs.unknown_reason(source) + "; or module:factory returning (device, task), "
                         "or a robot file (*.yaml, see docs/robots.md)")


def _checked_pair(made, source: str) -> tuple[Device, Task]:
    if (not isinstance(made, tuple) or len(made) != 2 or not isinstance(made[0], Device)
            or not isinstance(made[1], Task)):
        raise RobotFileError(f"{source}: the factory must return (device, task), a Device and a Task; "
                             f"got {type(made).__name__}")
    return made


def _import(spec: str, where: str, directory: Path | None = None):
    """``module:attr`` -> the callable, with ``directory`` (a robot file's) and the working directory
    importable (:func:`~embodyrl.hal.plugins.import_here`)."""
    module, _, attr = spec.partition(":")
    try:
        found = reduce(getattr, attr.split("."), import_here(module, directory))
    except ImportError as err:
        raise RobotFileError(f"{where}: cannot import {module!r} ({err})") from None
    except AttributeError:
        raise RobotFileError(f"{where}: module {module!r} has no {attr!r}") from None
    if not callable(found):
        raise RobotFileError(f"{where}: {spec} is not callable")
    return found


# -- robot files --------------------------------------------------------------------

class _Reader:
    """Reads one robot file's mapping, naming the file and the field in every error."""

    def __init__(self, label: str, directory: Path):
        self.label, self.directory = label, directory
        self.fields: list[tuple[str, str]] = []
        self.images: list[tuple[str, str, tuple[int, ...]]] = []
        self.classifier: dict | None = None
        """The record of the classifier the task reads: its directory and its files' hashes."""

    def fail(self, where: str, what: str):
        raise RobotFileError(f"{self.label}: {where}: {what}" if where else f"{self.label}: {what}")

    def mapping(self, value, where: str, known: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"expected a mapping, got {_shown(value)}")
        for key in value:
            if key not in known:
                self.fail(_at(where, str(key)), f"unknown field; known: {', '.join(known)}")
        for key in required:
            if key not in value:
                self.fail(_at(where, key), "missing")
        return value

    def settings(self, value, where: str, required: tuple[str, ...] = ()) -> dict:
        """A mapping whose keys are someone else's to know (a factory's arguments, a LeRobot config)."""
        return self.mapping(value, where, tuple(value) if isinstance(value, dict) else (), required)

    def one_of(self, value: dict, where: str, kinds: tuple[str, ...]) -> str:
        given = [k for k in kinds if k in value]
        if len(given) != 1:
            self.fail(where, f"give exactly one of {', '.join(kinds)}" + (f"; got {', '.join(given)}" if given else ""))
        return given[0]

    def number(self, value, where: str, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(where, f"expected a number, got {_shown(value)}")
        if positive and value <= 0:
            self.fail(where, f"must be > 0, got {value}")
        return float(value)

    def integer(self, value, where: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(where, f"expected a whole number, got {_shown(value)}")
        if value < minimum:
            self.fail(where, f"must be at least {minimum}, got {value}")
        return value

    def text(self, value, where: str) -> str:
        if not isinstance(value, str) or not value:
            self.fail(where, f"expected a name, got {_shown(value)}")
        return value

    def boolean(self, value, where: str) -> bool:
        if not isinstance(value, bool):
            self.fail(where, f"expected true or false, got {_shown(value)}")
        return value

    def numbers(self, value, where: str) -> float | tuple[float, ...]:
        """One number, or a list of them (one per element)."""
        if isinstance(value, list):
            if not value:
                self.fail(where, "expected a number or a list of numbers, got []")
            return tuple(self.number(v, f"{where}[{i}]") for i, v in enumerate(value))
        return self.number(value, where)

    def names(self, value, where: str, count: int | None = None) -> list[str]:
        if not isinstance(value, list) or (count is not None and len(value) != count):
            self.fail(where, f"expected a list of {count or 'some'} field names, got {_shown(value)}")
        return [self.text(v, f"{where}[{i}]") for i, v in enumerate(value)]

    def observed(self, name: str, where: str) -> str:
        """An observation field the specs must have (checked by :meth:`Robot.layout`)."""
        self.fields.append((where, name))
        return name

    def factory(self, value, where: str):
        spec = self.text(value, where)
        if not _FACTORY.match(spec):
            self.fail(where, f"expected package.module:callable, got {spec!r}")
        return _import(spec, f"{self.label}: {where}", directory=self.directory)

    def path(self, value, where: str) -> Path:
        path = Path(self.text(value, where)).expanduser()
        path = path if path.is_absolute() else self.directory / path
        if not path.is_file():
            self.fail(where, f"no file {path}")
        return path


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _shown(value) -> str:
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    return "nothing" if value is None else repr(value)


TOP = ("name", "device", "end_effector", "task", "control", "reset", "safety", "cameras", "reward_only", "teleop",
       "dataset_features")


def load_device(source: str) -> Device:
    """The device a robot file declares, with its end-effector and safety layers and its control rate,
    not connected (``embodyrl robot-server robot.yaml`` serves it); its task, if any, is neither needed
    nor built."""
    device, _ = _load_file(source, device_only=True).build()
    return device


def _load_file(source: str, file: dict | None = None, device_only: bool = False) -> _Part:
    """A robot file's part: read from the path ``source``, or rebuilt from its record ``file`` (path,
    sha256, declaration) when the file is gone. ``device_only``: no task is read (it may be absent)."""
    path = Path(source).expanduser().resolve()
    if file is None:
        if not path.is_file():
            raise RobotFileError(f"{source}: no such robot file")
        raw = path.read_bytes()
        file = {"path": str(path), "sha256": hashlib.sha256(raw).hexdigest(), "declaration": _parse_yaml(raw, source)}
    declaration = file["declaration"]
    r = _Reader(source, path.parent)
    data = r.mapping(declaration, "", TOP, required=("device",) if device_only else ("device", "task"))
    name = r.text(data["name"], "name") if "name" in data else path.stem
    if "/" in name or envs.SEPARATOR in name:
        r.fail("name", f"{name!r}: no '/' or '{envs.SEPARATOR}' in a device kind's name")
    control = r.mapping(data.get("control", {}), "control", ("rate_hz", "episode_steps", "realtime"))
    rate_hz = r.number(control["rate_hz"], "control.rate_hz", positive=True) if "rate_hz" in control else None
    steps = r.integer(control["episode_steps"], "control.episode_steps", 1) if "episode_steps" in control else None
    realtime = r.boolean(control.get("realtime", True), "control.realtime")
    reset = data.get("reset", "auto")
    if reset not in RESET_MODES:
        r.fail("reset", f"expected one of {', '.join(RESET_MODES)}, got {_shown(reset)}")
    cameras = tuple(r.observed(c, f"cameras[{i}]") for i, c in enumerate(r.names(data.get("cameras", []), "cameras")))
    reward_only = tuple(r.observed(f, f"reward_only[{i}]")
                        for i, f in enumerate(r.names(data.get("reward_only", []), "reward_only")))
    for i, field_name in enumerate(reward_only):
        if field_name in cameras:
            r.fail(f"reward_only[{i}]", f"{field_name!r} is in cameras too: the policy reads a camera field, so "
                                        "it is not reward-only")
    make_device = _device(r, data["device"], rate_hz, realtime)
    teleop = _teleop(r, data["teleop"]) if "teleop" in data else ""
    dataset_features = tuple((r.observed(r.text(field, "dataset_features"), f"dataset_features.{field}"),
                              r.text(feature, f"dataset_features.{field}"))
                             for field, feature in r.settings(data.get("dataset_features", {}),
                                                              "dataset_features").items())
    end_effector = _end_effector(r, data["end_effector"]) if "end_effector" in data else None
    make_task = (lambda: None) if device_only else _task(r, data["task"], name, steps, reset)
    reward_bound = REWARD_BOUND
    if not device_only and isinstance(data["task"], dict) and "reward_bound" in data["task"]:
        reward_bound = r.number(data["task"]["reward_bound"], "task.reward_bound", positive=True)
    safety = _safety(r, data.get("safety", {}))
    if r.classifier is not None:
        if "classifier" in file:  # rebuilt from a run's record: the classifier it trained with
            _check_classifier(source, file["classifier"])
        else:
            file = {**file, "classifier": r.classifier}

    def build() -> tuple[Device, Task]:
        device = make_device()
        if end_effector is not None:
            from .hal.end_effector import EndEffectorConfig, EndEffectorDevice

            try:
                device = EndEffectorDevice(device, EndEffectorConfig(**end_effector))
            except (ValueError, FileNotFoundError) as err:
                release(device)
                r.fail("end_effector", str(err))
        try:
            safe = SafeDevice(device, safety)
        except ValueError as err:
            release(device)
            r.fail("safety", str(err))
        if rate_hz is not None:
            safe.control_period_s = 1.0 / rate_hz
        return safe, make_task()

    return _Part(name, source, build, reset=reset, cameras=cameras, realtime=realtime,
                 fields=tuple(r.fields), images=tuple(r.images), reward_only=reward_only, file=file,
                 reward_bound=reward_bound, teleop=teleop, dataset_features=dataset_features)


def _parse_yaml(raw: bytes, label: str) -> dict:
    import yaml

    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise RobotFileError(f"{label}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise RobotFileError(f"{label}: expected a mapping at the top (device:, task:, ...), got {_shown(data)}")
    return data


_REMOTE = ("keys", "allow_insecure", "timeout_s", "retries")
_LEROBOT = ("bounds", "home", "home_s")


def _device(r: _Reader, value, rate_hz: float | None, realtime: bool) -> Callable[[], Device]:
    """``device:``, a factory returning a Device (or a LeRobot robot), a LeRobot robot by type, or a robot
    server's endpoint."""
    data = r.mapping(value, "device", ("factory", "args", "lerobot", "endpoint", *_REMOTE, *_LEROBOT))
    kind = r.one_of(data, "device", ("factory", "lerobot", "endpoint"))
    for key in _REMOTE if kind != "endpoint" else _LEROBOT:
        if key in data:
            r.fail(f"device.{key}", "belongs to a remote device (device.endpoint)" if key in _REMOTE
                   else "belongs to a LeRobot robot (device.lerobot, or a factory returning one)")
    if kind != "factory" and "args" in data:
        r.fail("device.args", "belongs to a device factory, not a remote device" if kind == "endpoint" else
               "belongs to a device factory; a LeRobot robot's settings go under device.lerobot")
    if kind != "endpoint":
        lerobot = _lerobot_options(r, data, rate_hz, realtime)
    if kind == "lerobot":
        settings = r.settings(data["lerobot"], "device.lerobot", ("type",))
        r.text(settings["type"], "device.lerobot.type")

        def made_lerobot() -> Device:
            from .hal.drivers.lerobot import wrap
            from .hal.lerobot import LeRobotError, make_robot

            try:
                return wrap(make_robot(settings, f"{r.label}: device.lerobot"), **lerobot())
            except LeRobotError as err:
                raise RobotFileError(str(err)) from None
        return made_lerobot
    if kind == "factory":
        factory = r.factory(data["factory"], "device.factory")
        args = r.settings(data.get("args", {}), "device.args")

        def made() -> Device:
            device = factory(**args)
            if isinstance(device, Device):
                if any(key in data for key in _LEROBOT):
                    r.fail("device.bounds", f"{data['factory']} returned a Device, which declares its own "
                                            "bounds; bounds, home and home_s are for a LeRobot robot")
                return device
            from .hal.lerobot import LeRobotError, is_robot

            if not is_robot(device):
                r.fail("device.factory", f"{data['factory']} returned {type(device).__name__}, not a Device "
                                         "or a LeRobot robot")
            from .hal.drivers.lerobot import wrap

            try:
                return wrap(device, **lerobot())
            except LeRobotError as err:
                raise RobotFileError(str(err)) from None
        return made
    endpoint = r.text(data["endpoint"], "device.endpoint")
    if not re.match(r"^(tcp|ipc)://", endpoint):
        r.fail("device.endpoint", f"expected tcp://HOST:PORT, got {endpoint!r}")
    keys = None
    if "keys" in data:
        given = r.mapping(data["keys"], "device.keys", ("secret_key", "server_key"), ("secret_key", "server_key"))
        keys = (r.path(given["secret_key"], "device.keys.secret_key"),
                r.path(given["server_key"], "device.keys.server_key"))
    insecure = r.boolean(data.get("allow_insecure", False), "device.allow_insecure")
    timeout_s = r.number(data.get("timeout_s", 0.5), "device.timeout_s", positive=True)
    retries = r.integer(data.get("retries", 3), "device.retries")
    from .hal.wire.security import ClientKeys, SecurityError, check_endpoint, is_loopback

    if keys is None and not insecure and not is_loopback(endpoint):
        r.fail("device.keys", f"{endpoint} is off this machine: give keys (secret_key, server_key; made with "
                              "embodyrl keys DIR NAME), or allow_insecure: true")

    def made() -> Device:
        from .hal.drivers.remote import RemoteDevice, RemoteError

        try:
            check_endpoint(endpoint, keys is not None, insecure)
            device = RemoteDevice(endpoint, keys=ClientKeys(*keys) if keys else None, allow_insecure=insecure,
                                  timeout_s=timeout_s, retries=retries)
            device.connect()  # the specs come from the robot server
        except (RemoteError, SecurityError) as err:
            where = "device.keys" if isinstance(err, SecurityError) else "device.endpoint"
            r.fail(where, f"{err} (is the robot server running there, with this actor's key authorised?)")
        return device
    return made


def _lerobot_options(r: _Reader, data: dict, rate_hz: float | None, realtime: bool) -> Callable[[], dict]:
    """What :func:`~embodyrl.hal.drivers.lerobot.wrap` takes besides the robot: the declared bounds (a
    LeRobot robot without them is refused by ``wrap``, naming its action features), the home pose, the
    control period and whether it is kept in real time."""
    bounds = {}
    if "bounds" in data:
        given = r.settings(data["bounds"], "device.bounds")
        bounds = {str(name): _pair(r, pair, f"device.bounds.{name}") for name, pair in given.items()}
    home = None
    if "home" in data:
        given = r.settings(data["home"], "device.home")
        home = {str(name): r.number(v, f"device.home.{name}") for name, v in given.items()}
    home_s = r.number(data["home_s"], "device.home_s", positive=True) if "home_s" in data else 2.0

    def options() -> dict:
        if rate_hz is None:
            r.fail("control.rate_hz", "missing: a LeRobot robot is stepped at the rate the file declares")
        return {"bounds": bounds, "home": home, "home_s": home_s, "control_period_s": 1.0 / rate_hz,
                "realtime": realtime, "label": f"{r.label}: device"}
    return options


def _teleop(r: _Reader, value) -> str:
    """``teleop:``, a ``--teleop`` source (``lerobot:so101_leader:port=/dev/ttyACM1``), or a LeRobot
    teleoperator as a mapping (``{lerobot: {type: so101_leader, port: /dev/ttyACM1}}``)."""
    from .hal.teleop import TeleopError, check_spec, lerobot_spec

    if isinstance(value, dict):
        given = r.mapping(value, "teleop", ("lerobot",), ("lerobot",))
        settings = r.settings(given["lerobot"], "teleop.lerobot", ("type",))
        try:
            spec = lerobot_spec(settings)
        except TeleopError as err:
            r.fail("teleop.lerobot", str(err))
    else:
        spec = r.text(value, "teleop")
    try:
        check_spec(spec)
    except TeleopError as err:
        r.fail("teleop", str(err))
    return spec


def _end_effector(r: _Reader, value) -> dict:
    """``end_effector:``, the arguments of :class:`~embodyrl.hal.end_effector.EndEffectorConfig`: the
    device's joints driven by end-effector moves through IK (MuJoCo is imported only to build it)."""
    at = "end_effector"
    data = r.mapping(value, at, ("model", "site", "joints", "joint_positions", "joint_velocities", "workspace",
                                 "max_step_m", "max_turn_rad", "command", "pd", "gripper", "rest", "joint_limits"),
                     ("model", "site", "workspace"))
    box = r.mapping(data["workspace"], f"{at}.workspace", ("low", "high"), ("low", "high"))
    low, high = (r.numbers(box[k], f"{at}.workspace.{k}") for k in ("low", "high"))
    if not (isinstance(low, tuple) and isinstance(high, tuple) and len(low) == len(high) == 3):
        r.fail(f"{at}.workspace", f"low and high are three numbers each (x, y, z in metres), got {low} and {high}")
    if np.any(np.asarray(low) > np.asarray(high)):
        r.fail(f"{at}.workspace", f"low {low} is above high {high}")
    config = {"model": str(_model_path(r, data["model"], f"{at}.model")), "site": r.text(data["site"], f"{at}.site"),
              "workspace_low": low, "workspace_high": high}
    if "joints" in data:
        config["joints"] = tuple(r.names(data["joints"], f"{at}.joints"))
    for key in ("joint_positions", "joint_velocities"):
        if key in data:
            config[key] = r.observed(r.text(data[key], f"{at}.{key}"), f"{at}.{key}")
    for key in ("max_step_m", "max_turn_rad"):
        if key in data:
            config[key] = r.number(data[key], f"{at}.{key}", positive=True)
    if "command" in data:
        config["command"] = data["command"]
        if data["command"] not in ("torque", "position"):
            r.fail(f"{at}.command", f"expected torque (a joint PD here) or position (the arm's own), got "
                                    f"{_shown(data['command'])}")
    if "pd" in data:
        if config.get("command") == "position":
            r.fail(f"{at}.pd", "gains belong to command: torque (with position the arm runs its own controller)")
        pd = r.mapping(data["pd"], f"{at}.pd", ("kp", "kd", "substeps", "gravity_compensation"))
        for key in ("kp", "kd"):
            if key in pd:
                config[key] = r.numbers(pd[key], f"{at}.pd.{key}")
        if "substeps" in pd:
            config["substeps"] = r.integer(pd["substeps"], f"{at}.pd.substeps", 1)
        if "gravity_compensation" in pd:
            config["gravity_compensation"] = r.boolean(pd["gravity_compensation"], f"{at}.pd.gravity_compensation")
    if "gripper" in data:
        config["gripper"] = r.integer(data["gripper"], f"{at}.gripper")
    if "rest" in data:
        rest = r.numbers(data["rest"], f"{at}.rest")
        config["rest"] = rest if isinstance(rest, tuple) else (rest,)
    if "joint_limits" in data:
        limits = r.settings(data["joint_limits"], f"{at}.joint_limits")
        config["joint_limits"] = tuple((name, *_pair(r, bounds, f"{at}.joint_limits.{name}"))
                                       for name, bounds in limits.items())
    return config


def _model_path(r: _Reader, value, where: str) -> Path:
    """A file path (relative to the robot file), or ``package:relative/path`` inside an installed
    package (``embodyrl.envs:assets/arm7.xml``), so a copied robot file still finds a shipped model."""
    text = r.text(value, where)
    found = re.match(r"^([A-Za-z_][\w.]*):(?!//)(.+)$", text)
    if found is None or Path(text).expanduser().exists():
        return r.path(text, where)
    from importlib import resources

    try:
        path = Path(str(resources.files(found.group(1)).joinpath(found.group(2))))
    except ModuleNotFoundError:
        r.fail(where, f"no package {found.group(1)!r} (package:relative/path) and no file {text!r}")
    if not path.is_file():
        r.fail(where, f"no file {found.group(2)!r} in package {found.group(1)}")
    return path


def _pair(r: _Reader, value, where: str) -> tuple[float, float]:
    bounds = r.numbers(value, where)
    if not isinstance(bounds, tuple) or len(bounds) != 2 or bounds[0] > bounds[1]:
        r.fail(where, f"expected [low, high], got {_shown(value)}")
    return bounds


_TERMS = ("distance", "norm", "squared", "value", "function")
_CONDITIONS = ("within_distance", "above", "below", "function")


def _task(r: _Reader, value, name: str, steps: int | None, reset: str) -> Callable[[], Task]:
    """``task:``, a factory returning a Task, or a declared reward."""
    data = r.mapping(value, "task", ("factory", "args", "reward", "end_on_success", "threshold", "name",
                                     "reward_bound"))
    if r.one_of(data, "task", ("factory", "reward")) == "factory":
        for key in ("end_on_success", "threshold"):
            if key in data:
                r.fail(f"task.{key}", "belongs to a declared reward (task.reward)")
        factory = r.factory(data["factory"], "task.factory")
        args = r.settings(data.get("args", {}), "task.args")

        def made() -> Task:
            task = factory(**args)
            if not isinstance(task, Task):
                r.fail("task.factory", f"{data['factory']} returned {type(task).__name__}, not a Task")
            if steps is not None:
                task.max_episode_steps = steps
            if "name" in data:
                task.name = r.text(data["name"], "task.name")
            return task
        return made
    if "args" in data:
        r.fail("task.args", "belongs to a task factory, not a declared reward")
    if steps is None:
        r.fail("control.episode_steps", "missing: a declared reward needs the episode length")
    if data["reward"] == PERSON:
        for key in ("threshold", "end_on_success"):
            if key in data:
                r.fail(f"task.{key}", f"belongs to a declared or classifier reward, not task.reward: {PERSON}")
        if reset != "operator":
            r.fail("task.reward", f"{PERSON}: the person labels each episode where they reset the scene; "
                                  "declare reset: operator")
        task_name = r.text(data.get("name", name), "task.name")
        return lambda: PersonTask(name=task_name, max_episode_steps=steps)
    if isinstance(data["reward"], str):
        return _classifier_task(r, data, name, steps)
    if "threshold" in data:
        r.fail("task.threshold", f"belongs to a classifier reward (task.reward: {CLASSIFIER}DIR)")
    reward = r.mapping(data["reward"], "task.reward", ("terms", "success"))
    if not reward.get("terms") and not reward.get("success"):
        r.fail("task.reward", "declare terms, success conditions, or both")
    terms = [_term(r, t, f"task.reward.terms[{i}]") for i, t in enumerate(_listed(r, reward, "terms"))]
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        r.fail("task.reward.terms", f"names must differ (set name:), got {names}")
    successes = [_condition(r, c, f"task.reward.success[{i}]") for i, c in enumerate(_listed(r, reward, "success"))]
    end = r.boolean(data.get("end_on_success", False), "task.end_on_success")
    if end and not successes:
        r.fail("task.end_on_success", "needs success conditions (task.reward.success)")
    task_name = r.text(data.get("name", name), "task.name")
    return lambda: DeclaredTask(Shaped(tuple(terms)) if terms else None, tuple(successes), name=task_name,
                                max_episode_steps=steps, end_on_success=end)


def _classifier_task(r: _Reader, data: dict, name: str, steps: int) -> Callable[[], Task]:
    """``task.reward: classifier:DIR`` (DIR relative to the robot file), ``task.threshold`` (default:
    the export's), ``task.end_on_success``."""
    given = data["reward"]
    if not given.startswith(CLASSIFIER) or not given[len(CLASSIFIER):]:
        r.fail("task.reward", f"expected terms and success conditions, {CLASSIFIER}DIR or {PERSON}; got {given!r}")
    directory = Path(given[len(CLASSIFIER):]).expanduser()
    directory = directory if directory.is_absolute() else r.directory / directory
    try:
        classifier = load_classifier(directory)
        hashes = classifier_hashes(directory)
    except (ClassifierError, OSError) as err:
        r.fail("task.reward", str(err))
    threshold = classifier.threshold
    if "threshold" in data:
        threshold = r.number(data["threshold"], "task.threshold")
        if not 0 < threshold < 1:
            r.fail("task.threshold", f"must be between 0 and 1, got {threshold}")
    r.observed(classifier.camera_field, "task.reward")
    r.images.append(("task.reward", classifier.camera_field, classifier.input_shape))
    r.classifier = {"path": str(directory.resolve()), "sha256": hashes}
    end = r.boolean(data.get("end_on_success", False), "task.end_on_success")
    task_name = r.text(data.get("name", name), "task.name")
    return lambda: ClassifierTask(classifier, threshold=threshold, name=task_name, max_episode_steps=steps,
                                  end_on_success=end)


def classifier_hashes(directory: Path) -> dict[str, str]:
    """The SHA-256 of each file of a classifier export, by name."""
    return {name: hashlib.sha256((Path(directory) / name).read_bytes()).hexdigest() for name in CLASSIFIER_FILES}


def _check_classifier(label: str, recorded: dict) -> None:
    """Refuse a classifier whose files differ from a run's record, naming them."""
    directory = Path(recorded["path"])
    changed = []
    for name, digest in recorded["sha256"].items():
        path = directory / name
        if not path.is_file():
            changed.append(f"{name} is gone")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            changed.append(name)
    if changed:
        raise RobotFileError(f"{label}: task.reward: the classifier changed since the run started "
                             f"({', '.join(changed)} in {directory}); restore it or start a new run")


def _listed(r: _Reader, data: dict, key: str) -> list:
    value = data.get(key) or []
    if not isinstance(value, list):
        r.fail(f"task.reward.{key}", f"expected a list, got {_shown(value)}")
    return value


def _term(r: _Reader, value, where: str) -> Term:
    data = r.mapping(value, where, ("name", "weight", *_TERMS), ("weight",))
    kind = r.one_of(data, where, _TERMS)
    weight = r.number(data["weight"], f"{where}.weight")
    arg, at = data[kind], f"{where}.{kind}"
    if kind == "distance":
        a, b = (r.observed(n, f"{at}[{i}]") for i, n in enumerate(r.names(arg, at, 2)))
        measure = distance(a, b)
        fn, label = (lambda o, act, next_o: measure(next_o)), f"distance({a}, {b})"
    elif kind == "function":
        fn, label = r.factory(arg, at), arg
    else:
        target = r.text(arg, at)
        if target != ACTION:
            r.observed(target, at)
        fn, label = _measure(kind, target), f"{kind}({target})"
    return Term(r.text(data.get("name", label), f"{where}.name"), weight, fn)


def _measure(kind: str, target: str):
    """``norm``, ``squared`` or ``value`` of the action a_t or of a field of o_{t+1}."""
    def read(action, next_observation) -> np.ndarray:
        return np.asarray(action if target == ACTION else next_observation[target], np.float64)

    if kind == "norm":
        return lambda o, a, next_o: float(np.linalg.norm(read(a, next_o)))
    if kind == "squared":
        return lambda o, a, next_o: float(np.sum(read(a, next_o) ** 2))
    return lambda o, a, next_o: float(np.sum(read(a, next_o)))


def _condition(r: _Reader, value, where: str) -> Success:
    data = r.mapping(value, where, ("value", *_CONDITIONS))
    kind = r.one_of(data, where, _CONDITIONS)
    paid = r.number(data.get("value", 1.0), f"{where}.value")
    arg, at = data[kind], f"{where}.{kind}"
    if kind == "function":
        return Success(r.factory(arg, at), paid)
    if kind == "within_distance":
        if not isinstance(arg, list) or len(arg) != 3:
            r.fail(at, f"expected [field_a, field_b, threshold], got {_shown(arg)}")
        a, b = (r.observed(r.text(n, f"{at}[{i}]"), f"{at}[{i}]") for i, n in enumerate(arg[:2]))
        return Success(within_distance(a, b, r.number(arg[2], f"{at}[2]", positive=True)), paid)
    if not isinstance(arg, list) or len(arg) != 2:
        r.fail(at, f"expected [field, threshold], got {_shown(arg)}")
    name = r.observed(r.text(arg[0], f"{at}[0]"), f"{at}[0]")
    threshold = r.number(arg[1], f"{at}[1]")
    if kind == "above":
        return Success(lambda o: bool(np.all(np.asarray(o[name]) > threshold)), paid)
    return Success(lambda o: bool(np.all(np.asarray(o[name]) < threshold)), paid)


class DeclaredTask(RewardTask):
    """A robot file's task: shaped terms plus success conditions, each paying its value.

    The episode succeeds when every success condition holds in its last observation
    (``episode_metrics()["success"]``, :meth:`success`); with ``end_on_success`` it ends there
    (terminated). A sparse task (success conditions only) pays ``success_reward`` for a person's
    success label (:mod:`embodyrl.hal.operator`)."""

    def __init__(self, shaped: Shaped | None, successes: tuple[Success, ...], *, name: str,
                 max_episode_steps: int, end_on_success: bool = False):
        self.shaped, self.successes = shaped, successes
        self.success_reward = sum(s.value for s in successes) if shaped is None and successes else None
        super().__init__(self._total, name=name, max_episode_steps=max_episode_steps,
                         terminate_on=self.success if end_on_success else None)

    def _total(self, observation, action, next_observation) -> float:
        total = self.shaped(observation, action, next_observation) if self.shaped is not None else 0.0
        return total + sum(s(observation, action, next_observation) for s in self.successes)

    def success(self, observation) -> bool:
        """Whether every success condition holds in ``observation`` (False without any)."""
        return bool(self.successes) and all(s.detector(observation) for s in self.successes)

    def episode_metrics(self, observations) -> dict[str, float]:
        return {"success": float(self.success(observations[-1]))} if self.successes else {}


class PersonTask(RewardTask):
    """A robot file's task judged by the person (``task.reward: person``, with ``reset: operator``): no
    reward during the episode; the person's success label at its end pays ``success_reward`` on the
    last step and ends it there (:func:`~embodyrl.hal.operator.apply_label`). The first task of a
    real robot, before anything can tell success from a camera (``embodyrl reward train`` learns that
    from the episodes labelled so)."""

    success_reward = 1.0

    def __init__(self, *, name: str, max_episode_steps: int):
        super().__init__(lambda observation, action, next_observation: 0.0, name=name,
                         max_episode_steps=max_episode_steps)


class ClassifierTask(RewardTask):
    """A robot file's task judged by a success classifier of camera frames (``task.reward: classifier:DIR``).

    The reward is :class:`~embodyrl.hal.rewards.LearnedReward`: 1.0 when the classifier's probability
    of success in o_{t+1} reaches ``threshold``, else 0. The episode succeeds when its last
    observation does (``episode_metrics()["success"]``); with ``end_on_success`` it ends there
    (terminated). A person's success label pays ``success_reward`` (:mod:`embodyrl.hal.operator`)."""

    success_reward = 1.0

    def __init__(self, classifier: SuccessClassifier, *, threshold: float, name: str, max_episode_steps: int,
                 end_on_success: bool = False):
        self.classifier, self.threshold = classifier, threshold
        self.learned = LearnedReward(classifier, threshold=threshold)
        super().__init__(self.learned, name=name, max_episode_steps=max_episode_steps,
                         terminate_on=self.success if end_on_success else None)

    def success(self, observation) -> bool:
        """Whether the classifier calls ``observation`` a success."""
        return self.learned(observation, None, observation) == 1.0

    def episode_metrics(self, observations) -> dict[str, float]:
        return {"success": float(self.success(observations[-1]))}


def _safety(r: _Reader, value) -> SafetyConfig:
    """``safety:``, what :class:`~embodyrl.hal.safety.SafetyConfig` enforces (clipping to the action
    bounds is always on)."""
    data = r.mapping(value, "safety", ("max_delta", "watchdog_s", "estop_after_faults", "safe_action", "workspace"))
    boxes = []
    workspace = data.get("workspace", [])
    if not isinstance(workspace, list):
        r.fail("safety.workspace", f"expected a list of boxes (field, low, high), got {_shown(workspace)}")
    for i, box in enumerate(workspace):
        at = f"safety.workspace[{i}]"
        box = r.mapping(box, at, ("field", "low", "high", "safe_action"), ("field", "low", "high"))
        low, high = r.numbers(box["low"], f"{at}.low"), r.numbers(box["high"], f"{at}.high")
        if np.any(np.asarray(low) > np.asarray(high)):
            r.fail(at, f"low {low} is above high {high}")
        safe = r.numbers(box["safe_action"], f"{at}.safe_action") if "safe_action" in box else None
        boxes.append(BoxLimit(r.observed(r.text(box["field"], f"{at}.field"), f"{at}.field"), low, high,
                              (safe,) if isinstance(safe, float) else safe))
    safe_action = r.numbers(data["safe_action"], "safety.safe_action") if "safe_action" in data else None
    return SafetyConfig(
        max_delta=r.numbers(data["max_delta"], "safety.max_delta") if "max_delta" in data else None,
        workspace=None if not boxes else boxes[0] if len(boxes) == 1 else Boxes(tuple(boxes)),
        safe_action=(safe_action,) if isinstance(safe_action, float) else safe_action,
        watchdog_s=r.number(data["watchdog_s"], "safety.watchdog_s", positive=True) if "watchdog_s" in data else None,
        estop_after_faults=r.integer(data.get("estop_after_faults", 3), "safety.estop_after_faults"))


@dataclass(frozen=True)
class Boxes:
    """Several workspace limits: the first one violated decides."""

    boxes: tuple[BoxLimit, ...]

    def __call__(self, observation, action):
        return next((o for o in (box(observation, action) for box in self.boxes) if o is not None), None)


def _kind(part: _Part) -> DeviceKind:
    """A part's device kind, the fields its file names checked against the specs."""
    device, _ = part.build()
    try:
        observation_spec, action_spec = device.observation_spec, device.action_spec
    finally:
        release(device)
    for where, name in part.fields:
        if name not in observation_spec:
            raise RobotFileError(f"{part.source}: {where}: {name!r} is not an observation field; "
                                 f"the robot observes {', '.join(observation_spec)}")
    for i, name in enumerate(part.cameras):
        spec = observation_spec[name]
        if len(spec.shape) != 3 or spec.dtype != np.uint8:
            raise RobotFileError(f"{part.source}: cameras[{i}]: {name!r} is {spec.dtype}{list(spec.shape)}, "
                                 "not an HxWxC uint8 image")
    for where, name, shape in part.images:
        spec = observation_spec[name]
        if spec.shape != tuple(shape) or spec.dtype != np.uint8:
            raise RobotFileError(f"{part.source}: {where}: the classifier reads {name!r} as uint8{list(shape)}; "
                                 f"the robot's is {spec.dtype}{list(spec.shape)}")
    return DeviceKind(part.name, observation_spec, action_spec)


def release(device: Device) -> None:
    """Close a device made only for its specs (a safety wrapper's connected driver too)."""
    device.close()
    inner = getattr(device, "inner", None)
    if isinstance(inner, Device):
        release(inner)


# -- what a run recorded ----------------------------------------------------------

def of_config(config) -> Robot:
    """The robot of a run's config, as recorded (``config.robot``) when the run started.

    A robot file is read again from its recorded absolute path, and refused when its content
    changed (naming what changed); a file no longer there is rebuilt from the recorded
    declaration. The layout is the recorded one."""
    record = getattr(config, "robot", None) or {}
    if not record:
        return load(config.task)
    files = record.get("files") or {}
    pieces = envs.parts(config.task) if envs.SEPARATOR in config.task and config.task not in files else (config.task,)
    gone, resolved = {}, []
    for piece in pieces:
        file = files.get(piece)
        if file is not None:
            path = Path(file["path"])
            if path.is_file():
                check_unchanged(piece, file)
            else:
                gone[str(path)] = file
            piece = str(path)
        resolved.append(piece)
    robot = replace(_load(envs.SEPARATOR.join(resolved), gone), source=config.task)
    if "layout" in record:
        robot = replace(robot, recorded_layout=_layout_from(record["layout"]))
    return robot


def check_unchanged(label: str, file: dict) -> None:
    """Refuse a robot file whose content differs from its record, naming what changed (or whose
    classifier's files do)."""
    raw = Path(file["path"]).read_bytes()
    if hashlib.sha256(raw).hexdigest() == file["sha256"]:
        if "classifier" in file:
            _check_classifier(label, file["classifier"])
        return
    try:
        changed = "; ".join(changes(file["declaration"], _parse_yaml(raw, label))) or "its comments or layout"
    except RobotFileError:
        changed = "it is no longer valid YAML"
    raise RobotFileError(f"{label}: the robot file changed since the run started ({changed}); restore "
                         f"{file['path']} or start a new run")


def layout_of(config) -> Layout:
    """The layout a run trains over: the recorded one (the learner never reaches the robot), else
    the task's."""
    record = getattr(config, "robot", None) or {}
    if "layout" in record:
        return _layout_from(record["layout"])
    return load(config.task).layout()


def reward_bounds_of(config) -> tuple[float, ...]:
    """Each device kind's reward bound for the learner: as the run recorded them (a run recorded before
    bounds were: :data:`~embodyrl.hal.steps.REWARD_BOUND`), else the task's. Builds no device."""
    record = getattr(config, "robot", None) or {}
    if "layout" in record:
        return tuple(float(k.get("reward_bound", REWARD_BOUND)) for k in record["layout"])
    return load(config.task).reward_bounds()


def _layout_from(kinds: list) -> Layout:
    return Layout(tuple(DeviceKind(k["name"], DictSpec.from_msg(k["observation_spec"]),
                                   ArraySpec.from_msg(k["action_spec"])) for k in kinds))


def changes(before, after, where: str = "") -> list[str]:
    """What differs between two declarations, as ``field: old -> new`` lines."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in list(before) + [k for k in after if k not in before]:
            at = _at(where, str(key))
            if key not in after:
                found.append(f"{at}: removed")
            elif key not in before:
                found.append(f"{at}: added")
            else:
                found += changes(before[key], after[key], at)
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [c for i, (b, a) in enumerate(zip(before, after, strict=True)) for c in changes(b, a, f"{where}[{i}]")]
    return [] if before == after else [f"{where or 'the file'}: {_brief(before)} -> {_brief(after)}"]


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
