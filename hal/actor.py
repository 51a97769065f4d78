"""The actor loop: drive devices with policies and stream steps to the learner.

The loop acts with the newest weights it holds, records every step with the
policy version that produced it, and sends batches as its credits allow.
Against a simulator it waits for credit when it has none: that is the
learner's samples-per-insert limit reaching the simulation. Each step::

    proposed = policy.act(o_t)                        (uniform random during warm-up)
    command  = intervention.poll(o_t) or proposed     (a person may override)
    o_t+1    = device.step(command)                   (the safety layer filters it)
    record(o_t, applied, proposed, r_t, source)       (applied: what the device got)

One loop drives one device, or every member of a :class:`DeviceGroup` (the
same constructor, tasks and policies by member name), each with its own
policy, task and recorder,
so each device's rows go to the learner tagged with its device id in their
own STEPS messages. With ``realtime=True`` a :class:`RateClock` paces the
loop at the (slowest) device's control rate (times ``time_scale``, for a
simulated device run faster than life).

With ``act_within_credit`` the loop acts only rows the learner has granted
credit for, so a synchronous on-policy learner gets no step acted by weights
it is about to replace. Short of credit, it sends what it recorded, then a
simulator waits; a real-time loop keeps ticking with its devices paused (no
step, so ``SafeDevice``'s watchdog holds hardware in its safe state) and
counts every paused control period.

A person in the loop (:mod:`.intervention`, :mod:`.operator`): an
intervention source may override any step, or throw the episode away
(:class:`~.intervention.EpisodeAborted`: it ends without a final row). With an
``operator`` (``reset: operator``) each episode's end waits, the device
holding its safe action, until the person has reset the scene and answered;
a success or failure label rewrites the last row's flags
(:func:`~.operator.apply_label`) before it is recorded, so the learner sees
it. The loop never waits on the learner: while the link is down it acts with
the weights it has and spools (the random warm-up goes on: it needs none); a
device whose policy never had weights holds its safe action (nothing
recorded) unless the person commands it, and ``ActorStats.learner`` says
``gone``.

The loop here is the core (act, step, record, send, wait for credit); the
person, the console and an outage of the learner (or a full spool) are
parts it calls at fixed points of each step (:mod:`.actor_parts`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .actor_console import ConsoleControl, device_entries
from .actor_parts import ConsoleHolds, Lane, LearnerGone, Person, SpoolPause
from .clock import RateClock, set_realtime_priority
from .console import ConsoleLink
from .device import Device, EpisodeInterrupted, EStopError
from .group import DeviceGroup
from .intervention import InterventionSource, new_episode
from .journal import already_spooled, journal_path
from .link import Link
from .operator import FirstAnswer, Operator
from .policy import Policy, UniformRandomPolicy
from .steps import StepRecorder, Steps
from .task import Task
from .wire.client import LinkError


def _members(device, task, policy, device_id, intervention) -> list[tuple]:
    """(device id, device, task, policy, intervention) of each device the loop drives."""
    if not isinstance(device, DeviceGroup):
        return [(device_id, device, task, policy, intervention)]
    names = [m.name for m in device.members]
    for what, given in (("tasks", task), ("policies", policy)):
        if not isinstance(given, Mapping) or set(given) != set(names):
            raise ValueError(f"{what}: a group's are given by member name, {sorted(names)}; got {given!r}")
    interventions = intervention or {}
    return [(m.device_id, m.device, task[m.name], policy[m.name], interventions.get(m.name))
            for m in device.members]


@dataclass(frozen=True)
class ActorConfig:
    actor_id: int = 0
    """Stable id of this actor; tags its steps and keys its sequence numbers."""
    send_every: int = 64
    """Step rows per batch sent to the learner."""
    random_steps: int = 1000
    """Uniform random actions before the policy takes over (off-policy warm-up)."""
    seed: int = 0
    resumed_at_rows: int = 0
    """Rows the run's replay held when this start of a resumed run began (0: a new run). A resumed
    start's actors are seeded from it (:func:`embodyrl.cli.processes.actor_seed`), so they draw new
    episodes and exploration instead of the first start's again."""
    credit_timeout_s: float = 120.0
    """Longest wait for credit before the learner is declared stuck."""
    handshake_timeout_s: float = 60.0
    """Longest wait for the learner's first WELCOME: a learner whose CurveZMQ does not admit this
    actor's key says nothing, so this is how long a wrong key takes to be reported (exit 1)."""
    realtime: bool = False
    """Pace the loop with a RateClock at the control rate (real hardware); off for simulators."""
    time_scale: float = 1.0
    """With ``realtime``: pace the loop at this multiple of the control rate. Only for simulated
    devices (a real-time run of a simulator that fits in minutes); 1 for hardware."""
    act_within_credit: bool = False
    """Act only rows the learner granted credit for (one row per device plus room for an episode's
    final row): short of credit, send what is recorded, then wait (a simulator) or hold the devices
    paused, counting the periods (``realtime``). Synchronous on-policy learning needs it."""
    realtime_priority: int = 0
    """With ``realtime``: run the loop under SCHED_FIFO at this priority (1-99) if permitted; 0: don't."""
    spool_dir: str = ""
    """Directory of the spool of unacknowledged batches (each actor uses ``actor-INDEX`` inside it):
    an actor restarted on it resends what the learner has not acknowledged. Empty: RAM only."""
    spool_disk_mb: int = 8192
    """The spool's disk budget; past it the actor pauses its devices or drops the oldest batches."""
    spool_on_full: str = "pause"
    """``pause`` (devices held in their safe state until acks drain the spool) or ``drop_oldest``."""
    flush_timeout_s: float = 300.0
    """The final flush: after its last step, how long the actor keeps resending what the learner has
    not acknowledged (through reconnects: a learner restarted with ``--resume`` takes its time). Past
    it the actor exits non-zero, saying how many rows its spool still holds; a restart on the same
    ``spool_dir`` delivers them. A learner's BYE ends the wait at once; so does a second stop signal."""
    teleop: str = ""
    """A person's input source that may take over any step (``keyboard``, ``gamepad[:PATH]``,
    ``spacemouse[:PATH]``, ``script:module:function``: :mod:`embodyrl.hal.teleop`); empty: none.
    ``embodyrl train`` gives it to actor 0. With it the loop runs in real time (``realtime``)."""
    reset: str = "auto"
    """``auto``: the device resets itself between episodes. ``operator``: at each episode's end the
    device holds its safe state until a person has reset the scene and answered go, success or
    failure (:mod:`embodyrl.hal.operator`); the answer labels the episode. Real time, as ``teleop``."""

    def __post_init__(self):
        if self.reset not in ("auto", "operator"):
            raise ValueError(f"actor.reset must be 'auto' or 'operator', not {self.reset!r}")
        if self.teleop:
            from .teleop import check_spec

            check_spec(self.teleop)  # a TeleopError is a ValueError naming the source
        if self.spool_on_full not in ("pause", "drop_oldest"):
            raise ValueError(f"actor.spool_on_full must be 'pause' or 'drop_oldest', not {self.spool_on_full!r}")
        if self.spool_disk_mb <= 0 or self.flush_timeout_s < 0:
            raise ValueError("actor.spool_disk_mb must be positive and actor.flush_timeout_s non-negative")
        if not self.handshake_timeout_s > 0:
            raise ValueError(f"actor.handshake_timeout_s must be positive, not {self.handshake_timeout_s!r}")
        if not self.time_scale > 0:
            raise ValueError(f"actor.time_scale must be positive, not {self.time_scale!r}")


@dataclass
class ActorStats:
    env_steps: int = 0
    episodes: int = 0
    batches_sent: int = 0
    weight_updates: int = 0
    interventions: int = 0
    """Steps a person overrode (recorded with source INTERVENTION)."""
    safety: dict[str, int] = field(default_factory=dict)
    """Safety-layer interventions by kind, summed over the loop's devices."""
    clock: dict[str, float] = field(default_factory=dict)
    """RateClock figures (ticks, missed, p50/p99/max ms) when paced."""
    returns: list[float] = field(default_factory=list)
    pauses: int = 0
    """Times the spool filled up (set to pause) and the devices were held in their safe state."""
    paused_steps: int = 0
    """Control periods spent paused."""
    credit_pauses: int = 0
    """Times ``act_within_credit`` stopped the loop until the learner granted credit."""
    credit_paused_steps: int = 0
    """Control periods a real-time loop spent paused for credit (devices held, nothing acted)."""
    credit_wait_s: float = 0.0
    """Seconds spent stopped for credit (waiting or paused)."""
    link: dict = field(default_factory=dict)
    """The link's figures: bytes and messages each way, RTT, resends, reconnects, spool depth."""
    learner: str = "connected"
    """``connected``, or ``gone`` while the link to the learner is down (the loop goes on)."""
    held_steps: int = 0
    """Control periods a device with no weights held its safe action because the learner was gone."""
    aborted: int = 0
    """Episodes the person threw away (ended without a final row)."""
    interrupted: int = 0
    """Episodes the device ended on its own (a robot server's watchdog after a pause): reset, then on."""
    labels: dict[str, int] = field(default_factory=dict)
    """The operator's answers at episodes' ends: go, success, failure."""
    operator_wait_s: float = 0.0
    """Seconds spent waiting for the operator to reset the scene and answer."""
    console_held_steps: int = 0
    """Control periods a device spent e-stopped or paused from the operator console."""
    recovered_rows: int = 0
    """Rows a killed predecessor recorded and never spooled, found in the journal and sent first."""

    def snapshot(self) -> dict:
        """A JSON-able summary (the latest return rather than all of them)."""
        return {"env_steps": self.env_steps, "episodes": self.episodes,
                "batches_sent": self.batches_sent, "weight_updates": self.weight_updates,
                "interventions": self.interventions, "safety": dict(self.safety),
                "clock": dict(self.clock), "pauses": self.pauses, "paused_steps": self.paused_steps,
                "credit_pauses": self.credit_pauses, "credit_paused_steps": self.credit_paused_steps,
                "credit_wait_s": round(self.credit_wait_s, 3),
                "link": dict(self.link), "learner": self.learner, "held_steps": self.held_steps,
                "aborted": self.aborted, "interrupted": self.interrupted, "labels": dict(self.labels),
                "operator_wait_s": round(self.operator_wait_s, 3), "console_held_steps": self.console_held_steps,
                "recovered_rows": self.recovered_rows,
                "last_return": self.returns[-1] if self.returns else None}


_Lane = Lane  # the name :mod:`.actor_console` annotates with


class ActorLoop:
    """Drive one device, or every member of a :class:`DeviceGroup`, and stream their steps.

    One device: ``task``, ``policy`` (and ``intervention``) are its own, ``device_id`` tags its
    rows. A group: each is a mapping by member name, and each member's rows carry its device id.
    ``operator``: a person resets the scene and labels each episode (``reset: operator``); while
    one device waits for the answer the others are not stepped. ``console``: the operator
    console's link (:mod:`.actor_console`: e-stop, pause, take over, answer, status, frames).

    The core here acts, steps, records and sends; the person, the console and an outage of the
    learner are parts (:mod:`.actor_parts`) that it calls at fixed points of each step.
    """

    def __init__(self, device: Device, task: Task | Mapping[str, Task], policy: Policy | Mapping[str, Policy],
                 link: Link, config: ActorConfig = ActorConfig(), device_id: int = 0,
                 intervention: InterventionSource | Mapping[str, InterventionSource] | None = None,
                 tap: Callable[[int, Steps], None] | None = None, operator: Operator | None = None,
                 console: ConsoleLink | None = None):
        self.operator = operator
        self._clock: RateClock | None = None
        self._should_stop = lambda: False  # run()'s, so a wait for credit ends on a stop signal
        self._credit_pause_started: float | None = None  # when act_within_credit stopped the loop
        self.link = link
        self.config = config
        self.stats = ActorStats()
        self.tap = tap
        """Called with (device_id, batch) for every batch sent (e.g. a DemoWriter)."""
        self.device, self.task, self.policy = device, task, policy
        spool = getattr(link, "spool", None)
        self._journals = getattr(spool, "directory", None)
        """A link that spools to a directory journals there the rows not yet batched (:mod:`.journal`)."""
        self.lanes = [self._lane(*lane) for lane in _members(device, task, policy, device_id, intervention)]
        self.recorder = self.lanes[0].recorder
        self._lanes_by_id = {lane.device_id: lane for lane in self.lanes}
        self.console: ConsoleControl | None = None
        if console is not None:
            self.console = ConsoleControl(console, self)
            if operator is not None:
                self.operator = FirstAnswer(operator, self.console.answers)
            names = {m.device_id: m.name for m in device.members} if isinstance(device, DeviceGroup) else {}
            console.start(device_entries(self.lanes, names))
        self.person = Person(self.operator, self.stats, config.actor_id, keep_alive=self._keep_alive,
                             should_stop=lambda: self._should_stop(), waited=self._waited)
        self.console_holds = ConsoleHolds(self.console, self.stats)
        self.learner_gone = LearnerGone(link, self.stats)
        self.spool_pause = SpoolPause(link, self.lanes, self.stats, config.actor_id, self._sent)

    def _lane(self, device_id, device, task, policy, intervention) -> Lane:
        cfg = self.config
        return Lane(device_id, device, task, policy,
                    UniformRandomPolicy(device.action_spec, seed=cfg.seed + device_id),
                    StepRecorder(device.observation_spec, device.action_spec, actor_id=cfg.actor_id,
                                 device_id=device_id, capacity=cfg.send_every + 2,
                                 journal=journal_path(self._journals, device_id) if self._journals else None),
                    intervention)

    def run(self, max_steps: int | None = None, should_stop=lambda: False,
            report: Callable[[dict], None] | None = None, report_every_s: float = 1.0) -> ActorStats:
        """Run until the learner says goodbye, ``max_steps`` (per device) or ``should_stop()``.

        ``report`` is called with :meth:`ActorStats.snapshot` about every
        ``report_every_s`` seconds and once at the end.
        """
        cfg, link = self.config, self.link
        self._should_stop = should_stop
        self._send_recovered()
        for lane in self.lanes:
            lane.observation = lane.device.reset(seed=cfg.seed + lane.device_id)
            new_episode(lane.intervention)
        period = max(lane.device.control_period_s for lane in self.lanes)
        clock = None
        if cfg.realtime:
            clock = self._clock = RateClock(cfg.time_scale / period)
            if cfg.realtime_priority:
                self.stats.clock["realtime_priority"] = float(set_realtime_priority(cfg.realtime_priority))
        next_report = time.monotonic() + report_every_s
        steps = 0
        while link.bye_reason is None and not should_stop() and (max_steps is None or steps < max_steps):
            self._keep_alive(0)
            self._refresh_weights()
            self.learner_gone.observe()
            if self.spool_pause.paused():  # the spool is full: devices stay in their safe state until it drains
                self.stats.paused_steps += 1
                steps += 1  # a control period passes, paused
                if clock is not None:
                    clock.tick()
                else:
                    link.poll(int(period * 1000))
                continue
            if cfg.act_within_credit and self._short_of_credit():
                self._stop_for_credit(clock)
                continue
            if self._credit_pause_started is not None:
                self.stats.credit_wait_s += time.monotonic() - self._credit_pause_started
                self._credit_pause_started = None
                self._refresh_weights()  # what came with the credit (a synchronous learner's new weights)
            warm = steps < cfg.random_steps  # uniform random actions: the off-policy warm-up
            for lane in self.lanes:
                self._step(lane, warm)
            steps += 1
            if clock is not None:
                clock.tick()
            if report is not None and time.monotonic() >= next_report:
                next_report += report_every_s
                report(self._collect(clock).snapshot())
        if link.bye_reason is None:  # into the spool now: the final flush waits for credit to send it
            for lane in self.lanes:
                if len(lane.recorder):
                    self.spool_pause.hand_over(lane.device_id, lane.recorder.flush())
        self._collect(clock)
        if self.console is not None:
            self.console.link.publish_status(self.console.status())
        if report is not None:
            report(self.stats.snapshot())
        return self.stats

    def _send_recovered(self) -> None:
        """Rows a killed predecessor recorded but never spooled (its journals) go first, unless
        it spooled them and died before emptying the journal."""
        for lane in self.lanes:
            steps = lane.recorder.recovered()
            if steps is None:
                continue
            if already_spooled(self.link.spool, lane.device_id, steps):
                lane.recorder.spooled()
                continue
            self.stats.recovered_rows += len(steps)
            self.spool_pause.hand_over(lane.device_id, steps)

    def _step(self, lane: Lane, warm: bool) -> None:
        """One control period of one device: act, step, record, each part called at its point."""
        if self.console_holds.holds(lane):  # held until the console says
            return
        policy = lane.warmup if warm else lane.policy
        observation, device, task = lane.observation, lane.device, lane.task
        proposed, extras = policy.act(observation, explore=True)
        acted = self.person.command(lane, observation, proposed)
        if acted is None:
            return
        command, source = acted
        if self.learner_gone.holds(lane, policy, source, warm):  # no weights, no learner to send them: safe
            return
        try:
            next_observation = device.step(command)
        except EpisodeInterrupted as err:
            warnings.warn(f"device {lane.device_id}: {err}; the episode ends without a final row, the device resets",
                          stacklevel=2)
            self.stats.interrupted += 1
            lane.restart()
            return
        except EStopError:
            if not self.console_holds.latched(lane):  # no one to clear it: the actor stops, naming the e-stop
                raise
            return
        self.console_holds.offer(lane, next_observation)
        applied = device.last_applied
        if applied is None:  # a bare device: the loop clips, as the device's own driver would
            applied = device.action_spec.clip(command)
        reward = task.reward(observation, applied, next_observation)
        terminated = task.terminated(next_observation)
        lane.t += 1
        truncated = not terminated and (
            (task.max_episode_steps is not None and lane.t >= task.max_episode_steps)
            or task.truncated(next_observation))  # e.g. a wrapped Gymnasium env's
        ended = terminated or truncated
        if ended:
            reward, terminated, truncated, label = self.person.label(lane, reward, terminated, truncated)
            self.console_holds.episode_ended(lane, label, next_observation)
        lane.recorder.add(observation, applied, proposed, reward, terminated, truncated,
                          policy.version, log_prob=extras.get("log_prob", 0.0), source=source)
        self.stats.env_steps += 1
        lane.episode_return += reward
        if ended:
            lane.recorder.add_final(next_observation)
            self.stats.episodes += 1
            self.stats.returns.append(lane.episode_return)
            lane.observation, lane.episode_return, lane.t = device.reset(), 0.0, 0
            new_episode(lane.intervention)
        else:
            lane.observation = next_observation
        if len(lane.recorder) >= self.config.send_every:
            self._send(lane)

    # -- what the console's commands call (:mod:`.actor_console`) ---------------------------
    def _restart(self, lane: Lane) -> None:
        lane.restart()

    def _stop_episode(self, lane: Lane) -> None:
        lane.stop_episode()

    # -- the loop's upkeep, its waits, its sends ---------------------------------------------
    def _keep_alive(self, timeout_ms: int) -> None:
        """The link's due work (waiting at most ``timeout_ms``) and the console's commands: every
        control period, and in every wait."""
        self.link.poll(timeout_ms)
        if self.console is not None:
            self.console.tick()

    def _waited(self) -> None:
        """A wait (for the operator) is over: it is not a missed deadline of the clock."""
        if self._clock is not None:
            self._clock.restart()

    def _short_of_credit(self) -> bool:
        """Whether acting one more step on every device could exceed the credit: each needs a row,
        plus one for the final row should its episode end."""
        recorded = sum(len(lane.recorder) for lane in self.lanes)
        return self.link.credits - recorded < 2 * len(self.lanes)

    def _stop_for_credit(self, clock: RateClock | None) -> None:
        """Send what is recorded (it has credit), then wait for more (a simulator) or let one control
        period pass with nothing acted (real time: the devices are not stepped, so hardware holds)."""
        if self._credit_pause_started is None:
            self._credit_pause_started = time.monotonic()
            self.stats.credit_pauses += 1
            for lane in self.lanes:
                self._send(lane)
        if clock is not None:
            self.stats.credit_paused_steps += 1
            clock.tick()
            return
        self._wait_for_credit(lambda: not self._short_of_credit(), self._credit_pause_started)

    def _wait_for_credit(self, enough: Callable[[], bool], since: float) -> bool:
        """Keep the link going until ``enough()`` or a stop (True) or the learner's goodbye (False);
        :class:`LinkError` once ``credit_timeout_s`` have passed since ``since``."""
        deadline = since + self.config.credit_timeout_s
        while not enough() and not self._should_stop():
            if self.link.bye_reason is not None:
                return False
            if time.monotonic() > deadline:
                raise LinkError(f"no credit from the learner for {self.config.credit_timeout_s} s")
            self._keep_alive(20)
        return True

    def _send(self, lane: Lane) -> None:
        """Hand over a device's recorded rows; a simulator first waits for the credit to send them
        (stopping: they go into the spool now), hardware never blocks."""
        rows = len(lane.recorder)
        if rows == 0:
            return
        if not self.config.realtime and not self._wait_for_credit(lambda: self.link.credits >= rows,
                                                                  time.monotonic()):
            return  # the learner said goodbye
        self.spool_pause.hand_over(lane.device_id, lane.recorder.flush())

    def _sent(self, device_id: int, steps: Steps) -> None:
        self._lanes_by_id[device_id].recorder.spooled()
        if self.tap is not None:
            self.tap(device_id, steps)
        self.stats.batches_sent += 1

    def _collect(self, clock: RateClock | None) -> ActorStats:
        safety: dict[str, int] = {}
        for lane in self.lanes:
            for kind, n in lane.device.interventions.items():
                safety[kind] = safety.get(kind, 0) + n
        self.stats.safety = safety
        self.stats.link = self.link.metrics()
        if clock is not None:
            self.stats.clock.update(clock.stats().to_dict())
        return self.stats

    def _refresh_weights(self) -> None:
        weights = self.link.take_weights()
        if weights is None:
            return
        for policy in {id(lane.policy): lane.policy for lane in self.lanes}.values():
            policy.load_weights(*weights)
        self.stats.weight_updates += 1
