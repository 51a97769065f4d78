"""The console's admin key: e-stops that only an admin lifts, sent to the robot servers themselves.

``embodyrl console --admin-key FILE --admin-robot ACTOR[:DEVICE]=ROBOT ...`` gives the console an
admin's CurveZMQ secret key (made by ``embodyrl keys``; its public half is in each robot server's
``--admin-keys``) and the robot servers it may reach with it, each named by the operator for the
actor id and device id (default 0) whose robot it serves. ``ROBOT`` is a robot file, whose
``device.endpoint`` and ``device.keys.server_key`` say where the server is and what its public key
is (as ``docs/robots.md`` declares a remote robot; the actor's own secret key in it is not read),
or ``ENDPOINT,SERVER_KEY_FILE``. No peer names an endpoint: the console dials only these, matched
by the actor id that the control endpoint bound to the peer's key or connection.

For each robot of a device the operator's action targets (:meth:`AdminKey.targets`):

* ``estop``: an admin ESTOP goes to the robot server at once, beside the command to the actor. The
  latch is the admin's, so the actor cannot lift it, and it reaches the robot even when the actor
  is gone or hung.
* ``clear_estop``: an admin CLEAR (``release=False``: the actor keeps its session) goes to the robot
  server first, then the command to the actor, whose own CLEAR and reset start the robot again.

Without the admin key a ``clear_estop`` reaches the robot server only as the actor's own CLEAR,
which an admin's latch refuses (``estop_by_admin``); the console passes that refusal on and says
what it would take (:data:`NEEDS_ADMIN_KEY`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq

from ..hal.drivers.remote import RemoteError, admin_request
from ..hal.wire.control import is_id
from ..hal.wire.robot import CLEAR, ESTOP
from ..hal.wire.security import ClientKeys, SecurityError, load_keys

ADMIN_ACTIONS = ("estop", "clear_estop")
"""The actions the console also sends to a robot server with its admin key."""
NEEDS_ADMIN_KEY = ("an admin's e-stop needs this console's admin key for this robot: embodyrl console "
                   "--admin-key FILE --admin-robot {actor}:{device}=ROBOT")
"""Added to a ``clear_estop`` the robot server refused as ``estop_by_admin``, where no admin robot is given."""
_ROBOT = re.compile(r"^(\d+)(?::(\d+))?=(.+)$")
_ENDPOINT = re.compile(r"^(tcp|ipc)://\S+$")


@dataclass(frozen=True)
class AdminRobot:
    """One robot server the console may reach with its admin key, and whose device it serves."""

    actor_id: int
    device_id: int
    endpoint: str
    server_key: Path
    """The robot server's public ``.key`` file."""
    source: str = ""
    """What the operator gave: the robot file, or the endpoint."""

    def name(self) -> str:
        return f"robot server {self.endpoint} (actor {self.actor_id} device {self.device_id})"

    def view(self) -> dict:
        return {"actor_id": self.actor_id, "device_id": self.device_id, "endpoint": self.endpoint,
                "source": self.source}


def parse_robot(text: str) -> AdminRobot:
    """``ACTOR[:DEVICE]=ROBOT`` (ROBOT: a robot file, or ``ENDPOINT,SERVER_KEY_FILE``) as an
    :class:`AdminRobot`; ValueError naming what is wrong. The server key must be a public key file."""
    match = _ROBOT.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r}: expected ACTOR[:DEVICE]=ROBOT, ROBOT a robot file (*.yaml) or "
                         "ENDPOINT,SERVER_KEY_FILE")
    actor, device = int(match[1]), int(match[2] or 0)
    if not (is_id(actor) and is_id(device)):
        raise ValueError(f"{text!r}: actor and device ids are integers in [0, 2^31 - 1]")
    robot = match[3].strip()
    if robot.lower().endswith((".yaml", ".yml")):
        endpoint, server_key = _robot_file(Path(robot).expanduser())
    else:
        endpoint, _, key = robot.rpartition(",")
        if not endpoint:
            raise ValueError(f"{text!r}: give a robot file (*.yaml) or ENDPOINT,SERVER_KEY_FILE (the robot "
                             "server's public key)")
        endpoint, server_key = endpoint.strip(), Path(key.strip()).expanduser()
    if not _ENDPOINT.match(endpoint):
        raise ValueError(f"{text!r}: expected a tcp://HOST:PORT endpoint, got {endpoint!r}")
    try:
        load_keys(server_key)
    except SecurityError as err:
        raise ValueError(f"{text!r}: the robot server's public key: {err}") from None
    return AdminRobot(actor, device, endpoint, server_key, robot)


def _robot_file(path: Path) -> tuple[str, Path]:
    """(endpoint, server public key file) of a robot file's remote device; the key's path is
    relative to the file, as every path in a robot file is."""
    import yaml

    try:
        data = yaml.safe_load(path.read_bytes())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: cannot read the robot file ({err})") from None
    device = data.get("device") if isinstance(data, dict) else None
    endpoint = device.get("endpoint") if isinstance(device, dict) else None
    if not isinstance(endpoint, str):
        raise ValueError(f"{path}: device.endpoint: none given; only a robot served by a robot server has "
                         "an e-stop the admin key reaches")
    keys = device.get("keys")
    server_key = keys.get("server_key") if isinstance(keys, dict) else None
    if not isinstance(server_key, str):
        raise ValueError(f"{path}: device.keys.server_key: none given; an admin key is CurveZMQ and needs the "
                         "robot server's public key")
    key = Path(server_key).expanduser()
    return endpoint, key if key.is_absolute() else path.parent / key


class AdminKey:
    """The admin's secret key and the robot servers it reaches, each for one (actor, device).

    ``timeout_s`` and ``retries``: each admin request's first deadline and its retries (each twice
    as long); ESTOP and CLEAR are idempotent at the server, so a lost reply is simply sent again."""

    def __init__(self, secret_key: str | Path, robots: Sequence[AdminRobot], *, timeout_s: float = 1.0,
                 retries: int = 1):
        self.secret_key = Path(secret_key)
        try:
            _, secret = load_keys(self.secret_key)
        except SecurityError as err:
            raise ValueError(str(err)) from None
        if secret is None:
            raise ValueError(f"{self.secret_key} holds no secret key (give the admin's NAME.key_secret)")
        if not robots:
            raise ValueError("an admin key needs the robot servers it may reach (ACTOR[:DEVICE]=ROBOT)")
        self.robots: dict[tuple[int, int], AdminRobot] = {}
        for robot in robots:
            at = (robot.actor_id, robot.device_id)
            if at in self.robots:
                raise ValueError(f"actor {at[0]} device {at[1]} is given two robot servers "
                                 f"({self.robots[at].endpoint} and {robot.endpoint})")
            self.robots[at] = robot
        self.timeout_s, self.retries = timeout_s, retries
        self._context = zmq.Context()

    def targets(self, actor: int | None, device: int | None) -> list[AdminRobot]:
        """The robots of the devices an action for ``actor`` and ``device`` (None: every one) reaches."""
        return [robot for (a, d), robot in sorted(self.robots.items())
                if (actor is None or a == actor) and (device is None or d == device)]

    async def send(self, robot: AdminRobot, kind: str, received: float, reason: str = "") -> dict:
        """An admin ESTOP or CLEAR (``release=False``) to ``robot``'s server, off the event loop; the
        result as the action's results show one (``ms`` since ``received``)."""
        if kind not in (ESTOP, CLEAR):
            raise ValueError(f"an admin sends ESTOP or CLEAR, not {kind!r}")
        result = {"target": robot.name(), "ok": False, "error": "", "ms": None, "applied_ms": None}
        try:
            await asyncio.to_thread(
                admin_request, robot.endpoint, ClientKeys(self.secret_key, robot.server_key), kind,
                reason=reason or "operator console e-stop", release=False, timeout_s=self.timeout_s,
                retries=self.retries, context=self._context)
        except RemoteError as err:
            result["error"] = f"admin {kind}: {err}"
        except (zmq.ZMQError, SecurityError, OSError) as err:  # an endpoint gone bad, a key file since removed
            result["error"] = f"admin {kind}: {type(err).__name__}: {err}"
        else:
            result["ok"] = True
        result["ms"] = round((time.monotonic() - received) * 1000, 2)
        return result

    def view(self) -> list[dict]:
        """What the page shows: each robot server and the device it serves (never the key)."""
        return [robot.view() for _, robot in sorted(self.robots.items())]

    def close(self) -> None:
        self._context.term()
