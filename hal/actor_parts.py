"""The actor loop's parts: what a person, the operator console and an outage do to a step.

:class:`~.actor.ActorLoop` is a core (act, step, record, send) that calls
these at fixed points; each keeps its own counters in the loop's
:class:`~.actor.ActorStats`. Every control period::

    learner_gone.observe()              learner connected or gone (the link says)
    spool_pause.paused()                a full spool holds every device until it drains
    per device (a Lane):
        console_holds.holds(lane)       e-stopped or paused from the console: held, not stepped
        proposed = policy.act(o_t)
        person.command(...)             a person's command overrides (None: nothing to step)
        learner_gone.holds(...)         no weights and no learner: the safe action, unrecorded
        o_t+1 = device.step(command)    console_holds.latched(lane) if the safety layer e-stopped it
        console_holds.offer(lane, o_t+1)
        person.label(...)               at an episode's end the operator's answer labels it
        console_holds.episode_ended(...)
        record; spool_pause.hand_over(...) every ``send_every`` rows

A part that waits (the operator's answer) keeps the link and the console
going through the loop's ``keep_alive``; a device it holds meanwhile
commands its safe action (:func:`~.device.hold_safe`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .actor_console import ConsoleControl
from .device import Device, hold_safe
from .intervention import EpisodeAborted, InterventionSource, new_episode
from .link import Link
from .operator import Answer, Operator, apply_label, task_success, wait_for_answer
from .policy import Policy, UniformRandomPolicy
from .steps import NO_POLICY, Source, StepRecorder, Steps
from .task import Task
from .wire.spool import SpoolFull

if TYPE_CHECKING:
    from .actor import ActorStats


@dataclass
class Lane:
    """One device stream: its device, task, policy, recorder and episode state."""

    device_id: int
    device: Device
    task: Task
    policy: Policy
    warmup: UniformRandomPolicy
    recorder: StepRecorder
    intervention: InterventionSource | None = None
    observation: dict[str, np.ndarray] | None = None
    episode_return: float = 0.0
    t: int = 0
    holding: bool = False
    """Holding the safe action (no weights, learner gone); the next acted step starts an episode."""
    paused: bool = False
    """Paused from the operator console: held in its safe state until resumed."""
    takeover: bool = False
    """Taken over from the operator console: every step is the teleop source's."""

    def stop_episode(self) -> None:
        """The episode in progress ends without a final row (its rows are not sent)."""
        self.recorder.abandon_episode()
        self.episode_return, self.t = 0.0, 0
        new_episode(self.intervention)

    def restart(self) -> None:
        """The episode ends without a final row (thrown away or interrupted); a new one starts."""
        self.stop_episode()
        self.observation = self.device.reset()


class Person:
    """A person in the loop: an intervention source per device that may override any step (or
    throw the episode away), and an ``operator`` who resets the scene at each episode's end and
    may label it a success or failure (``reset: operator``).

    ``keep_alive(timeout_ms)``: the loop's upkeep (link, console) while the operator is awaited;
    ``should_stop()``: ends that wait; ``waited()``: called after it (the clock starts afresh)."""

    def __init__(self, operator: Operator | None, stats: ActorStats, actor_id: int, *,
                 keep_alive: Callable[[int], None], should_stop: Callable[[], bool], waited: Callable[[], None]):
        self.operator, self.stats, self.actor_id = operator, stats, actor_id
        self._keep_alive, self._should_stop, self._waited = keep_alive, should_stop, waited

    def command(self, lane: Lane, observation: dict[str, np.ndarray],
                proposed: np.ndarray) -> tuple[np.ndarray, Source] | None:
        """(command, source) of this step; None when nothing is to be stepped: the person threw the
        episode away (a new one has started), or holds a taken-over device without a safe action."""
        if lane.intervention is None:
            return proposed, Source.ONLINE
        try:
            human = lane.intervention.poll(observation)
        except EpisodeAborted:
            self.stats.aborted += 1
            lane.restart()
            return None
        if human is None and lane.takeover:  # the person has the device: no command holds it
            human = lane.device.safe_action
            if human is None:
                return None
        if human is None:
            return proposed, Source.ONLINE
        self.stats.interventions += 1
        return human, Source.INTERVENTION

    def label(self, lane: Lane, reward: float, terminated: bool,
              truncated: bool) -> tuple[float, bool, bool, bool | None]:
        """At an episode's end with an operator: wait for the answer, then (reward, terminated,
        truncated) as it labels the last row (:func:`~.operator.apply_label`) and the label (None: go,
        no operator, or a stop while waiting)."""
        if not (terminated or truncated) or self.operator is None:
            return reward, terminated, truncated, None
        answer = self._ask(lane, reward, terminated)
        if answer is None:
            return reward, terminated, truncated, None
        name = answer.name.lower()
        self.stats.labels[name] = self.stats.labels.get(name, 0) + 1
        return (*apply_label(lane.task, answer.success, reward, terminated, truncated), answer.success)

    def _ask(self, lane: Lane, reward: float, terminated: bool) -> Answer | None:
        """Hold the device safe (the link kept alive) until the operator answers; None on a stop."""
        device = lane.device

        def hold() -> None:
            hold_safe(device)
            self._keep_alive(0)

        started = time.monotonic()
        summary = (f"actor {self.actor_id}, device {lane.device_id}: episode {self.stats.episodes + 1} "
                   f"ended after {lane.t} steps, return {lane.episode_return + reward:.2f}"
                   + (" (the task ended it)" if terminated else ""))
        answer = wait_for_answer(self.operator, summary, every=hold, period_s=device.control_period_s,
                                 should_stop=self._should_stop, device_id=lane.device_id)
        self.stats.operator_wait_s += time.monotonic() - started
        self._waited()  # the wait is not a missed deadline
        return answer


class ConsoleHolds:
    """The operator console at each step (``control`` None: no console, every call a no-op):
    a device e-stopped or paused from it is held, not stepped; an e-stop the safety layer latches
    ends the episode and waits for the console's clear; frames and episodes' outcomes go to it.
    Its commands and status are :class:`~.actor_console.ConsoleControl`'s."""

    def __init__(self, control: ConsoleControl | None, stats: ActorStats):
        self.control, self.stats = control, stats

    def holds(self, lane: Lane) -> bool:
        """Whether the device is held this period (e-stopped, or paused: its safe action)."""
        if self.control is None or not (lane.device.estopped or lane.paused):
            return False
        self.stats.console_held_steps += 1
        if not lane.device.estopped:
            hold_safe(lane.device)
        return True

    def latched(self, lane: Lane) -> bool:
        """The device's safety layer latched an e-stop: with a console the episode ends and the
        device is held until the console clears it (True); without one, no one can (False: the
        actor stops, naming the e-stop)."""
        if self.control is None:
            return False
        lane.stop_episode()
        return True

    def offer(self, lane: Lane, observation: dict[str, np.ndarray]) -> None:
        if self.control is not None:
            self.control.link.offer(lane.device_id, observation)

    def episode_ended(self, lane: Lane, label: bool | None, final: dict[str, np.ndarray]) -> None:
        """Count the episode's outcome: the operator's label, else the task's own success signal."""
        if self.control is not None:
            self.control.episode_ended(label if label is not None else task_success(lane.task, [final]))


class LearnerGone:
    """While the link to the learner is down the loop goes on (the warm-up, the person, policies
    with weights); a device whose policy never had weights holds its safe action, unrecorded."""

    def __init__(self, link: Link, stats: ActorStats):
        self.link, self.stats = link, stats

    def observe(self) -> None:
        self.stats.learner = "connected" if self.link.connected else "gone"

    def holds(self, lane: Lane, policy: Policy, source: Source, warm: bool) -> bool:
        """Whether the device holds this period: the policy is to act (no person, no warm-up), has
        no weights, and no learner can send them. The episode in progress is abandoned; the next
        acted step starts one from where the device is."""
        if source != Source.ONLINE or warm or policy.version != NO_POLICY or self.stats.learner != "gone":
            lane.holding = False
            return False
        if not lane.holding:
            lane.holding = True
            lane.stop_episode()
        self.stats.held_steps += 1
        observation = hold_safe(lane.device)
        if observation is not None:
            lane.observation = observation
        return True


class SpoolPause:
    """A full spool (``spool_on_full: pause``): the batches it refuses wait here, oldest first, and
    every device holds its safe state until they are in. ``sent(device_id, batch)`` is called for
    each batch the link took."""

    def __init__(self, link: Link, lanes: list[Lane], stats: ActorStats, actor_id: int,
                 sent: Callable[[int, Steps], None]):
        self.link, self.lanes, self.stats, self.actor_id, self.sent = link, lanes, stats, actor_id, sent
        self.held: list[tuple[int, Steps]] = []

    def hand_over(self, device_id: int, steps: Steps) -> None:
        """Give a batch to the link; if the spool is full, hold it and pause the devices."""
        try:
            self.link.send_steps(device_id, steps)
        except SpoolFull as err:
            if not self.held:
                warnings.warn(f"actor {self.actor_id}: {err}; devices paused in their safe state "
                              "until the learner acknowledges what the spool holds", stacklevel=2)
                self.stats.pauses += 1
                for lane in self.lanes:  # command the safe state once; the watchdog holds it
                    if lane.device.safe_action is not None and not lane.device.estopped:
                        lane.device.step(lane.device.safe_action)
            self.held.append((device_id, steps))
            return
        self.sent(device_id, steps)

    def paused(self) -> bool:
        """Hand over the held batches again; True while the spool still refuses one (the devices
        stay paused). Once all are in, every device's interrupted episode ends where the pause
        began and the device resets."""
        if not self.held:
            return False
        while self.held:
            device_id, steps = self.held[0]
            try:
                self.link.send_steps(device_id, steps)
            except SpoolFull:
                return True
            self.held.pop(0)
            self.sent(device_id, steps)
        for lane in self.lanes:  # as every other restart: a teleop source hears of the new episode too
            lane.restart()
        return False
