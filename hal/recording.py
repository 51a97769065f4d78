"""Recording one demonstration episode: a person (or a script) drives the device.

::

    o_0 = device.reset()
    each control period:
        a_t = source.poll(o_t) or hold_action     # the person's command, else stay put
        o_t+1 = device.step(a_t)                  # the safety layer filters it
        row t: o_t, the applied action, r_t, terminated/truncated  (source=DEMONSTRATION)
    until the task terminates or the episode's step limit

The episode comes back whole, as one :class:`Steps` batch ending with its
final row, with the task's own success signal where it has one
(:func:`~.operator.task_success`). A stop signal or the source's
:class:`~.intervention.EpisodeAborted` ends it with nothing kept: the caller
writes only whole episodes (``embodyrl record``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .clock import RateClock
from .device import Device
from .intervention import new_episode
from .operator import apply_label, task_success
from .steps import NO_POLICY, Source, StepRecorder, Steps
from .task import Task


class Interrupted(Exception):
    """A stop signal arrived mid-episode; the episode is dropped."""


@dataclass
class RecordedEpisode:
    steps: Steps
    """Every row of the episode, its final row last."""
    length: int
    """Acted rows (the final row not counted)."""
    episode_return: float
    commanded: int
    """Steps the person (or script) commanded; the others held still."""
    task_success: bool | None
    """The task's own success signal (None: it has none)."""

    def label(self, task: Task, success: bool | None) -> None:
        """Apply a person's label to the last acted row (:func:`~.operator.apply_label`)."""
        if success is None:
            return
        s, i = self.steps, self.length - 1
        reward, terminated, truncated = apply_label(task, success, float(s.reward[i]),
                                                    bool(s.terminated[i]), bool(s.truncated[i]))
        self.episode_return += reward - float(s.reward[i])
        s.reward[i], s.terminated[i], s.truncated[i] = reward, terminated, truncated


def hold_action(device: Device) -> np.ndarray:
    """What the device is commanded while the person commands nothing: its safe action (a position-
    controlled arm's holds it where it is now), else the middle of the action bounds (zeros where
    unbounded)."""
    safe = getattr(device, "safe_action", None)
    if safe is not None:
        return np.asarray(safe)
    spec = device.action_spec
    low = np.broadcast_to(spec.minimum if spec.minimum is not None else 0.0, spec.shape)
    high = np.broadcast_to(spec.maximum if spec.maximum is not None else 0.0, spec.shape)
    middle = np.where(np.isfinite(low) & np.isfinite(high), (low + high) / 2, 0.0)
    return middle.astype(spec.dtype)


def record_episode(device: Device, task: Task, source, *, max_steps: int | None = None,
                   seed: int | None = None, clock: RateClock | None = None,
                   should_stop: Callable[[], bool] = lambda: False, actor_id: int = 0,
                   device_id: int = 0) -> RecordedEpisode:
    """Record one episode of ``source`` driving ``device`` (see the module docstring).

    ``max_steps`` overrides the task's episode length; one of them is needed. ``clock`` paces the
    loop (a person needs the device's real rate; a script on a simulator may go as fast as it
    can). Raises :class:`Interrupted` on ``should_stop()``, and lets the source's
    :class:`~.intervention.EpisodeAborted` through; either way nothing is kept.
    """
    limit = max_steps or task.max_episode_steps
    if not limit:
        raise ValueError(f"task {task.name!r} sets no episode length: give max_steps")
    recorder = StepRecorder(device.observation_spec, device.action_spec, actor_id=actor_id,
                            device_id=device_id, capacity=limit + 1)
    observation = device.reset(seed=seed)
    observations = [observation]
    new_episode(source)
    if clock is not None:
        clock.restart()
    total, commanded = 0.0, 0
    for t in range(limit):
        if should_stop():
            raise Interrupted(f"stopped at step {t}")
        command = source.poll(observation)
        if command is None:
            command = hold_action(device)  # each step: a position-controlled arm holds where it is now
        else:
            commanded += 1
        next_observation = device.step(command)
        applied = getattr(device, "last_applied", None)
        if applied is None:
            applied = device.action_spec.clip(command)
        reward = task.reward(observation, applied, next_observation)
        terminated = task.terminated(next_observation)
        truncated = not terminated and (t + 1 == limit or task.truncated(next_observation))
        recorder.add(observation, applied, command, reward, terminated, truncated, NO_POLICY,
                     source=Source.DEMONSTRATION)
        total += reward
        observation = next_observation
        observations.append(observation)
        if clock is not None:
            clock.tick()
        if terminated or truncated:
            break
    recorder.add_final(observation)
    return RecordedEpisode(recorder.flush(), t + 1, total, commanded, task_success(task, observations))
