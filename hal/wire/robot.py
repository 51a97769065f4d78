"""The robot conversation: a remote actor drives a robot server, on top of :mod:`.codec`.

The server (:mod:`..robot_server`) binds a ROUTER next to the hardware; the
actor's :class:`~..drivers.remote.RemoteDevice` dials it over DEALER. Every
message is the codec's ``[msgpack header, raw array frames]``; every request
carries a ``seq`` in its fields and every reply echoes it::

    HELLO  {seq}                 -> SPECS {seq, observation_spec, action_spec,
                                           control_period_s, watchdog_s}
                                  | REFUSED {seq, reason}   (another actor is in control)
    RESET  {seq, seed}           -> OBS {seq, health, reason} + observation arrays
    STEP   {seq} + action        -> OBS ...                  | ERROR {seq, reason, detail}
    ESTOP  {seq, reason}         -> OK {seq}   (safe action now; latches until CLEARed by one who may)
    CLEAR  {seq}                 -> OK {seq}   | ERROR {seq, reason: estop_by_admin | estop_by_owner
                                                                      | driver_hung, detail}
    STATUS {seq}                 -> OK {seq, counters...}    (anyone may ask; monitoring)
    BYE    {seq}                 -> OK {seq}   (safe action, session released)

An admin key may send ESTOP and CLEAR from outside the session:
``ESTOP {seq, reason}`` and ``CLEAR {seq, release}`` answer ``OK {seq, released}``.

Sequence numbers make retries idempotent: the server caches its last reply
and replays it for a repeated ``seq`` and ignores older ones, so an actor
whose reply was lost sends the same request again. This module holds what
both sides must agree on: the kinds, the refusals the actor acts on, the
SPECS reply's fields, and what the server decodes.
"""

from __future__ import annotations

from ..specs import ArraySpec, DictSpec
from .codec import Limits

HELLO, SPECS, REFUSED = "HELLO", "SPECS", "REFUSED"
RESET, STEP, OBS = "RESET", "STEP", "OBS"
ESTOP, CLEAR, STATUS, BYE, OK, ERROR = "ESTOP", "CLEAR", "STATUS", "BYE", "OK", "ERROR"

NO_SESSION = "no_session"
"""ERROR reason: the sender holds no session (send HELLO first, or it expired)."""
ESTOPPED = "estopped"
"""ERROR reason: an e-stop is latched; RESET and STEP are refused until someone who may CLEARs it."""
WATCHDOG_TRIPPED = "watchdog"
"""ERROR reason: the watchdog stopped the robot (no command in time); the episode is over, RESET goes on."""
BAD_ACTION, OUT_OF_BOUNDS = "bad_action", "out_of_bounds"
"""ERROR reasons: the STEP's action does not fit the action spec, or leaves its bounds."""

ROBOT_LIMITS = Limits(max_header_bytes=16 * 1024, max_arrays=8, max_ndim=4,
                      max_frame_bytes=1 << 20, max_message_bytes=1 << 20)
"""What the server decodes: requests carry one small action, nothing larger."""


def specs_fields(observation_spec: DictSpec, action_spec: ArraySpec, control_period_s: float,
                 watchdog_s: float, holds_in_place: bool = False) -> dict:
    """A SPECS reply's fields (``seq`` aside); ``holds``: the robot's safe action holds it where it is
    (:class:`~embodyrl.hal.device.HoldInPlace`), sent only when true."""
    fields = {"observation_spec": observation_spec.to_msg(), "action_spec": action_spec.to_msg(),
              "control_period_s": float(control_period_s), "watchdog_s": float(watchdog_s)}
    if holds_in_place:
        fields["holds"] = True
    return fields


def read_specs(fields: dict) -> tuple[DictSpec, ArraySpec, float, float]:
    """(observation spec, action spec, control period, watchdog period) from a SPECS reply's fields;
    raises KeyError, TypeError or ValueError on a malformed one."""
    return (DictSpec.from_msg(fields["observation_spec"]), ArraySpec.from_msg(fields["action_spec"]),
            float(fields["control_period_s"]), float(fields["watchdog_s"]))
