"""An actor loop under the operator console: the commands it applies, the status it shows.

The loop calls :meth:`ConsoleControl.tick` once per control period and in
every wait (for credit, for the operator, with a full spool), so a command
reaches the device within a period of arriving, from the loop's own thread
(drivers are not thread-safe). Per device, or every device of the actor:

* ``estop`` latches the device's e-stop (its driver commands its safe
  state); the loop stops stepping it, ends the episode unrecorded, and waits
  for ``clear_estop``, after which the device resets and a new episode
  starts;
* ``pause`` holds the device in its safe state (the episode ends
  unrecorded) until ``resume``;
* ``takeover`` hands every step to the actor's teleop source (a step where
  the person gives no command holds the safe action), recorded as an
  intervention, until ``release``;
* ``answer`` answers the operator-reset prompt: go, success or failure.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .console import ConsoleLink, camera_fields
from .operator import Answer, ConsoleAnswers
from .wire.control import Command

if TYPE_CHECKING:
    from .actor import ActorLoop, _Lane

ANSWERS = {"go": Answer.GO, "success": Answer.SUCCESS, "failure": Answer.FAILURE}


def device_name(device) -> str:
    """A device's own name, looked for through its wrappers (the safety layer's ``inner``), else
    the driver's class name."""
    while True:
        name = getattr(device, "name", None)
        if isinstance(name, str) and name:
            return name
        inner = getattr(device, "inner", None)
        if inner is None:
            return type(device).__name__
        device = inner


def device_entries(lanes, names: dict[int, str]) -> list[dict]:
    """What a HELLO says of each device: id, name (a group member's, else the device's own),
    cameras, whether a person can take over."""
    return [{"device_id": lane.device_id, "name": names.get(lane.device_id) or device_name(lane.device),
             "cameras": camera_fields(lane.device.observation_spec), "teleop": lane.intervention is not None}
            for lane in lanes]


class ConsoleControl:
    """Applies the console's commands to an :class:`~.actor.ActorLoop`'s devices and publishes
    its status (about four times a second)."""

    def __init__(self, link: ConsoleLink, loop: ActorLoop, status_every_s: float = 0.25):
        self.link, self.loop = link, loop
        self.answers = ConsoleAnswers()
        self.status_every_s = status_every_s
        self._next_status = 0.0
        self.successes = self.judged = 0
        """Episodes judged a success, of those judged (by the operator, or the task's own signal)."""

    def tick(self) -> None:
        for command in self.link.take_commands():
            error = self._apply(command)
            self.link.done(command, not error, error)
        now = time.monotonic()
        if now >= self._next_status:
            self._next_status = now + self.status_every_s
            self.link.publish_status(self.status())

    def episode_ended(self, success: bool | None) -> None:
        if success is not None:
            self.judged += 1
            self.successes += int(success)

    # -- commands ------------------------------------------------------------
    def _targets(self, command: Command) -> list[_Lane]:
        lanes = self.loop.lanes
        if command.device_id is None:
            return list(lanes)
        return [lane for lane in lanes if lane.device_id == command.device_id]

    def _apply(self, command: Command) -> str:
        """Apply ``command``; '' when done, else why not (every device it could not do, named)."""
        lanes = self._targets(command)
        if not lanes:
            return f"actor {self.loop.config.actor_id} has no device {command.device_id}"
        errors = []
        for lane in lanes:
            try:
                error = self._apply_to(command, lane)
            except Exception as err:  # noqa: BLE001 - a driver's failure is the command's answer
                error = f"{type(err).__name__}: {err}"
            if error:
                errors.append(f"device {lane.device_id}: {error}")
        return "; ".join(errors)

    def _apply_to(self, command: Command, lane: _Lane) -> str:
        loop, action = self.loop, command.action
        if action == "estop":
            if not lane.device.estopped:
                lane.device.estop("operator console")
            loop._stop_episode(lane)
        elif action == "clear_estop":
            if lane.device.estopped:
                lane.device.clear_estop()
                loop._restart(lane)
        elif action in ("pause", "resume"):
            if lane.paused != (action == "pause"):
                lane.paused = action == "pause"
                if lane.paused:
                    loop._stop_episode(lane)
                else:
                    loop._restart(lane)
        elif action in ("takeover", "release"):
            if action == "takeover" and lane.intervention is None:
                return "no teleop source to take over with (actor.teleop)"
            lane.takeover = action == "takeover"
        elif action == "answer":
            if loop.operator is None:
                return "not waiting for an answer (the actor resets by itself: actor.reset is auto)"
            return self.answers.give(lane.device_id, ANSWERS[command.value])
        else:
            return f"an actor does not {action}"
        return ""

    # -- status ----------------------------------------------------------------
    def status(self) -> dict:
        loop = self.loop
        stats, metrics = loop.stats, loop.link.metrics()
        prompt = self.answers.prompt
        devices = []
        for lane in loop.lanes:
            device = lane.device
            safety = {kind: int(n) for kind, n in dict(device.interventions).items()}
            health = device.health()
            devices.append({
                "device_id": lane.device_id, "estopped": bool(device.estopped),
                "estop_reason": health.reason if device.estopped else "",
                "paused": lane.paused, "takeover": lane.takeover,
                "episode": {"step": lane.t, "return": float(lane.episode_return)},
                "safety": safety, "watchdog_trips": safety.get("watchdog", 0),
                "prompt": ({"summary": prompt["summary"], "allow_go": prompt["allow_go"]}
                           if prompt is not None and prompt["device_id"] == lane.device_id else None)})
        return {"env_steps": stats.env_steps, "episodes": stats.episodes, "successes": self.successes,
                "judged": self.judged, "interventions": stats.interventions, "learner": stats.learner,
                "reset": "operator" if loop.operator is not None else "auto",
                "link": {"rtt_ms": metrics.get("rtt_ms"), "resends": int(metrics.get("resent_batches", 0)),
                         "reconnects": int(metrics.get("reconnects", 0)),
                         "spool_batches": int(metrics.get("spool_batches", 0)),
                         "spool_rows": int(metrics.get("spool_rows", 0))},
                "stream": self.link.stream.fields(), "frames_sent": self.link.frames_sent,
                "frames_dropped": self.link.frames_dropped, "stream_error": self.link.stream_error,
                "devices": devices}
