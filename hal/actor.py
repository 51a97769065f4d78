"""The actor loop: drive a device with a policy and stream steps to the learner.

The loop acts with the newest weights it holds, records every step with the
policy version that produced it, and sends batches as its credits allow.
Against a simulator it waits for credit when it has none: that is the
learner's samples-per-insert limit reaching the simulation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .device import Device
from .policy import Policy, UniformRandomPolicy
from .steps import StepRecorder
from .task import Task
from .wire.client import LearnerLink, LinkError


@dataclass(frozen=True)
class ActorConfig:
    actor_id: int = 0
    """Stable id of this actor; tags its steps and keys its sequence numbers."""
    send_every: int = 64
    """Step rows per batch sent to the learner."""
    random_steps: int = 1000
    """Uniform random actions before the policy takes over (off-policy warm-up)."""
    seed: int = 0
    credit_timeout_s: float = 120.0
    """Longest wait for credit before the learner is declared stuck."""


@dataclass
class ActorStats:
    env_steps: int = 0
    episodes: int = 0
    batches_sent: int = 0
    weight_updates: int = 0
    returns: list[float] = field(default_factory=list)


class ActorLoop:
    def __init__(self, device: Device, task: Task, policy: Policy, link: LearnerLink,
                 config: ActorConfig = ActorConfig(), device_id: int = 0):
        self.device = device
        self.task = task
        self.policy = policy
        self.link = link
        self.config = config
        self.device_id = device_id
        self.stats = ActorStats()
        self._warmup = UniformRandomPolicy(device.action_spec, seed=config.seed)
        self.recorder = StepRecorder(device.observation_spec, device.action_spec,
                                     actor_id=config.actor_id, device_id=device_id,
                                     capacity=config.send_every + 2)

    def run(self, max_steps: int | None = None, should_stop=lambda: False) -> ActorStats:
        """Run until the learner says goodbye, ``max_steps`` or ``should_stop()``."""
        cfg, device, task = self.config, self.device, self.task
        observation = device.reset(seed=cfg.seed)
        episode_return, t = 0.0, 0
        while (self.link.bye_reason is None and not should_stop()
               and (max_steps is None or self.stats.env_steps < max_steps)):
            self.link.poll(0)
            self._refresh_weights()
            warm = self.stats.env_steps < cfg.random_steps
            policy = self._warmup if warm else self.policy
            proposed, extras = policy.act(observation, explore=True)
            applied = device.action_spec.clip(proposed)
            next_observation = device.step(applied)
            reward = task.reward(observation, applied, next_observation)
            terminated = task.terminated(next_observation)
            t += 1
            truncated = not terminated and task.max_episode_steps is not None and t >= task.max_episode_steps
            self.recorder.add(observation, applied, proposed, reward, terminated, truncated,
                              policy.version, log_prob=extras.get("log_prob", 0.0))
            self.stats.env_steps += 1
            episode_return += reward
            if terminated or truncated:
                self.recorder.add_final(next_observation)
                self.stats.episodes += 1
                self.stats.returns.append(episode_return)
                observation, episode_return, t = device.reset(), 0.0, 0
            else:
                observation = next_observation
            if len(self.recorder) >= cfg.send_every:
                self._send()
        if self.link.bye_reason is None:
            self._send()
        return self.stats

    def _refresh_weights(self) -> None:
        weights = self.link.take_weights()
        if weights is not None:
            self.policy.load_weights(*weights)
            self.link.held_version = weights[0]
            self.stats.weight_updates += 1

    def _send(self) -> None:
        rows = len(self.recorder)
        if rows == 0:
            return
        deadline = time.monotonic() + self.config.credit_timeout_s
        while self.link.credits < rows:
            if self.link.bye_reason is not None:
                return
            if time.monotonic() > deadline:
                raise LinkError(f"no credit from the learner for {self.config.credit_timeout_s} s")
            self.link.poll(50)
        self.link.send_steps(self.device_id, self.recorder.flush())
        self.stats.batches_sent += 1
