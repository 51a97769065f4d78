"""The actor <-> learner conversation, on top of :mod:`.codec`.

::

    actor -> learner   HELLO(actor name and id, devices with specs, last acked seq)
    learner -> actor   WELCOME(run id, incarnation, credits[, policy exports])  or  REFUSED(reason)
    actor -> learner   STEPS(seq, device id, steps as array frames)
    learner -> actor   ACK(seq committed, credits granted)
    learner -> actor   WEIGHTS(version, encoding, parameter frames)
    both ways          HEARTBEAT(time); BYE(reason)
    learner -> actor   BYE(reason, restart): `embodyrl learner` stopped before its step budget;
                       the actor keeps its spool and dials again (the learner is started again
                       with --resume)

HELLO carries the actor's wire ``protocol`` and is itself written in
protocol 1 (it has no arrays), so a learner of any version can read it and
answer: a learner refuses an actor of another version with REFUSED (written
in the older of the two), and an actor leaves a learner whose WELCOME names
another, each with a reason that says which side to upgrade.

An actor without JAX sets HELLO's ``policy_graphs``; its WELCOME then
carries ``policies`` (device id -> the export's meta, :mod:`..runtime`) with
the export's arrays named ``<device id>/<name>``, and ``policy_errors``
(device id -> why the learner has none) where it cannot export one.

A relay (``embodyrl relay``) stands between a learner and the actors of one host or rack: each
actor dials it as it would the learner, the relay passes everything on on a connection of the
actor's own, adding ``relayed_by`` (its name) to the actor's HELLO so the learner sends that session
no weights, and itself says HELLO with ``relay: true``, no devices and an id at most
:data:`RELAY_IDS`, to take each publication once and serve its actors under the same rules.

Actors dial out over DEALER and the learner binds a ROUTER, so a robot
behind NAT needs no inbound port. Credits count step rows: an actor sends
only what it has credit for, which is how the learner's samples-per-insert
limit reaches the actors. ``ACK(seq)`` means the replay holds every batch up
to ``seq``; the learner drops a batch whose seq it has already committed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..specs import ArraySpec, DictSpec, SpecError
from ..steps import PolicyVersion
from .codec import PROTOCOL_VERSION, PROTOCOLS, MessageError

HELLO = "HELLO"
WELCOME = "WELCOME"
REFUSED = "REFUSED"
STEPS = "STEPS"
ACK = "ACK"
WEIGHTS = "WEIGHTS"
HEARTBEAT = "HEARTBEAT"
BYE = "BYE"
KINDS = frozenset({HELLO, WELCOME, REFUSED, STEPS, ACK, WEIGHTS, HEARTBEAT, BYE})


RELAY_IDS = -2
"""A relay's own session has an id at most this: -2 - its index (-1 is the learner's demonstrations)."""


def relay_id(index: int) -> int:
    return RELAY_IDS - index


def ingest_endpoint(learner: str, port: int) -> str:
    """Where an actor dials the ingest port ``port`` a learner at ``learner`` named (a REFUSED with
    ``ingest_port``): the same host, so the learner's keys and the actor's address stay as they were."""
    if not learner.startswith("tcp://") or ":" not in learner[6:] or not 0 < port < 65536:
        raise MessageError("field_type", f"ingest_port {port} for a learner at {learner}: a TCP port of its host")
    return f"{learner.rsplit(':', 1)[0]}:{port}"


HELLO_PROTOCOL = 1
"""The protocol HELLO is written in: the oldest, so every learner reads it."""


def version_mismatch(peer, peer_role: str, own_role: str) -> str | None:
    """Why a ``peer_role`` speaking wire protocol ``peer`` cannot talk to this ``own_role``; None if it can."""
    if peer == PROTOCOL_VERSION:
        return None
    older = peer_role if type(peer) is int and peer < PROTOCOL_VERSION else own_role
    return (f"wire protocol mismatch: the {peer_role} speaks {peer!r}, the {own_role} {PROTOCOL_VERSION} "
            f"(protocol 2 packs small arrays into one frame); upgrade the {older}")


def reply_protocol(peer: int) -> int:
    """The version to answer a peer in: the older of the two that this side writes."""
    return max(min(peer, PROTOCOL_VERSION), PROTOCOLS[0]) if type(peer) is int else PROTOCOLS[0]


def field(fields: dict, name: str, kind: type | tuple[type, ...]):
    """``fields[name]`` if present and of ``kind``; else a MessageError."""
    if name not in fields:
        raise MessageError("field_missing", f"field {name!r} is missing")
    value = fields[name]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise MessageError("field_type", f"field {name!r} is a bool")
    if not isinstance(value, kind):
        raise MessageError("field_type", f"field {name!r} is {type(value).__name__}")
    return value


def version_field(fields: dict, name: str = "version") -> PolicyVersion:
    value = field(fields, name, list)
    if len(value) != 2 or not all(type(v) is int for v in value):
        raise MessageError("field_type", f"field {name!r} must be [incarnation, count]")
    return PolicyVersion(*value)


@dataclass(frozen=True)
class DeviceInfo:
    """What an actor declares about each device it drives."""

    device_id: int
    name: str
    observation_spec: DictSpec
    action_spec: ArraySpec

    def to_msg(self) -> dict:
        return {"device_id": self.device_id, "name": self.name,
                "observation_spec": self.observation_spec.to_msg(),
                "action_spec": self.action_spec.to_msg()}

    @classmethod
    def from_msg(cls, msg) -> DeviceInfo:
        if not isinstance(msg, dict):
            raise MessageError("field_type", "device entry must be a map")
        try:
            return cls(field(msg, "device_id", int), field(msg, "name", str),
                       DictSpec.from_msg(field(msg, "observation_spec", list)),
                       ArraySpec.from_msg(field(msg, "action_spec", dict)))
        except SpecError as err:
            raise MessageError("spec", str(err)) from None


def policy_exports(fields: dict, arrays: dict, device_ids: list[int]) -> dict[int, tuple[dict, dict] | str]:
    """A WELCOME's policy exports: device id -> ``(meta, arrays)`` (copies: the frames are read-only), or
    the reason it has none (the learner's, or that it sent nothing: a learner that predates them)."""
    policies = fields.get("policies")
    errors = fields.get("policy_errors") if type(fields.get("policy_errors")) is dict else {}
    if type(policies) is not dict:
        policies = {}
    out: dict[int, tuple[dict, dict] | str] = {}
    for device_id in device_ids:
        meta = policies.get(str(device_id))
        if type(meta) is not dict:
            out[device_id] = str(errors.get(str(device_id), "the learner sent no policy graph for it"))
            continue
        prefix = f"{device_id}/"
        out[device_id] = (meta, {name[len(prefix):]: array.copy() for name, array in arrays.items()
                                 if name.startswith(prefix)})
    return out
