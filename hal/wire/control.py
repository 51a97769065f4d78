"""The console conversation: actors and the learner dial the operator console.

::

    peer -> console   HELLO(role, actor id, devices, protocol)
    console -> peer   WELCOME(stream settings)  or  REFUSED(reason, retry, retry_after_s)
    peer -> console   STATUS(status map)               about 4 times a second
    peer -> console   METRICS(record)                  the learner: each metrics record it writes
    peer -> console   FRAME(device id, field, seq, size) + the JPEG bytes as a uint8 array
    console -> peer   COMMAND(id, action, device id or nil, value)
    peer -> console   DONE(id, ok, error)

Peers dial out over DEALER and the console binds a ROUTER (CurveZMQ like
every other link), so a robot behind NAT reaches it and an e-stop needs
neither the learner nor an inbound port at the robot. Messages are
:mod:`.codec` messages: msgpack headers, nothing unpickled, sizes checked
before anything is decoded. This module holds what both sides must agree on:
the kinds, the actions, and the checks of each message's fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codec import Limits, MessageError
from .protocol import field

HELLO, WELCOME, REFUSED = "HELLO", "WELCOME", "REFUSED"
STATUS, METRICS, FRAME = "STATUS", "METRICS", "FRAME"
COMMAND, DONE, BYE = "COMMAND", "DONE", "BYE"
KINDS = frozenset({HELLO, WELCOME, REFUSED, STATUS, METRICS, FRAME, COMMAND, DONE, BYE})

CONTROL_PROTOCOL = 1
ROLES = ("actor", "learner")
MAX_ID = 2**31 - 1
"""The largest actor or device id (the page and the log keep ids exact)."""
STATUS_EVERY_S = 0.25
"""A peer's link sends STATUS this often (its latest, repeated). Without keys the console holds a
peer's id against other claimants while it has heard the peer within 3 of these."""

DEVICE_ACTIONS = ("estop", "clear_estop", "pause", "resume", "takeover", "release", "answer")
"""Actions a device applies (per device, or every device of an actor)."""
ACTOR_ACTIONS = ("stream",)
"""Actions the actor's console link applies itself (the camera stream's rate and size)."""
LEARNER_ACTIONS = ("pause_training", "resume_training")
ACTIONS = DEVICE_ACTIONS + ACTOR_ACTIONS + LEARNER_ACTIONS
ANSWERS = ("go", "success", "failure")
STREAM_WIDTHS = (80, 160, 320, 640)
MAX_STREAM_FPS = 30.0

LIMITS = Limits(max_header_bytes=256 * 1024, max_arrays=1, max_frame_bytes=4 << 20,
                max_message_bytes=4 << 20)
"""What a console message may be: a status map of up to 256 KiB, one JPEG of up to 4 MiB."""
HELLO_LIMITS = Limits(max_header_bytes=48 * 1024, max_arrays=0, max_frame_bytes=0, max_message_bytes=0)
"""What a peer without a session may send: a HELLO, whose devices the console shows in at most
32 KiB, so a larger one is refused before it is decoded."""


@dataclass(frozen=True)
class Command:
    """One action for a peer: ``device_id`` None means every device of the actor."""

    id: str
    action: str
    device_id: int | None = None
    value: object = None

    def fields(self) -> dict:
        return {"id": self.id, "action": self.action, "device": self.device_id, "value": self.value}


@dataclass(frozen=True)
class StreamSettings:
    """The camera stream an actor sends: ``fps`` frames a second per camera (0: off), at most
    ``width`` pixels wide (never enlarged)."""

    fps: float = 5.0
    width: int = 160

    def fields(self) -> dict:
        return {"fps": self.fps, "width": self.width}


def stream_settings(value) -> StreamSettings:
    """Check a ``stream`` action's value ({"fps": n, "width": w}); MessageError naming the fault."""
    if not isinstance(value, dict):
        raise MessageError("field_type", "stream: value must be a map with fps and width")
    fps, width = value.get("fps"), value.get("width")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 <= fps <= MAX_STREAM_FPS:
        raise MessageError("field_type", f"stream: fps must be a number in [0, {MAX_STREAM_FPS:g}], not {fps!r}")
    if width not in STREAM_WIDTHS:
        raise MessageError("field_type", f"stream: width must be one of {list(STREAM_WIDTHS)}, not {width!r}")
    return StreamSettings(float(fps), int(width))


def command(fields: dict) -> Command:
    """A COMMAND's fields, checked (a peer refuses a bad one with DONE, naming the fault)."""
    action = field(fields, "action", str)
    if action not in ACTIONS:
        raise MessageError("field_type", f"unknown action {action!r}; one of {list(ACTIONS)}")
    device = fields.get("device")
    if device is not None and not is_id(device):
        raise MessageError("field_type", f"device must be an integer in [0, {MAX_ID}] or nil, not {device!r}")
    value = fields.get("value")
    if action == "answer" and value not in ANSWERS:
        raise MessageError("field_type", f"answer: value must be one of {list(ANSWERS)}, not {value!r}")
    if action == "stream":
        stream_settings(value)
    elif action != "answer" and value is not None:
        raise MessageError("field_type", f"{action}: takes no value, not {value!r}")
    return Command(field(fields, "id", str), action, device, value)


def is_id(value) -> bool:
    """Whether ``value`` is an actor or device id: an integer in [0, :data:`MAX_ID`]."""
    return type(value) is int and 0 <= value <= MAX_ID


def hello(fields: dict) -> tuple[str, int, list[dict]]:
    """(role, actor id, devices) of a HELLO, checked."""
    protocol = fields.get("protocol")
    if protocol != CONTROL_PROTOCOL:
        raise MessageError("protocol", f"console protocol {protocol!r}; this side speaks {CONTROL_PROTOCOL}")
    role = field(fields, "role", str)
    if role not in ROLES:
        raise MessageError("field_type", f"role must be one of {list(ROLES)}, not {role!r}")
    actor_id = field(fields, "actor_id", int)
    if not is_id(actor_id):
        raise MessageError("field_type", f"actor_id must be an integer in [0, {MAX_ID}], not {actor_id!r}")
    devices = field(fields, "devices", list)
    if len(devices) > 256:
        raise MessageError("field_type", f"{len(devices)} devices; at most 256")
    checked = []
    for device in devices:
        if not isinstance(device, dict):
            raise MessageError("field_type", "each device must be a map")
        cameras = field(device, "cameras", list)
        if not all(isinstance(c, str) and len(c) <= 128 for c in cameras) or len(cameras) > 16:
            raise MessageError("field_type", "cameras must be at most 16 field names")
        device_id = field(device, "device_id", int)
        if not is_id(device_id):
            raise MessageError("field_type", f"device_id must be an integer in [0, {MAX_ID}], not {device_id!r}")
        checked.append({"device_id": device_id, "name": str(field(device, "name", str))[:64],
                        "cameras": cameras, "teleop": bool(device.get("teleop", False))})
    return role, actor_id, checked
