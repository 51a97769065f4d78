"""Evaluate a policy on a (device, task) pair: returns and the task's own metrics."""

from __future__ import annotations

import numpy as np

from .hal.device import Device
from .hal.policy import Policy
from .hal.task import Task


def run_episode(device: Device, task: Task, policy: Policy, seed: int, explore: bool = False):
    """One episode from ``device.reset(seed)``; returns (return, observations)."""
    observation = device.reset(seed=seed)
    observations, total = [observation], 0.0
    for _ in range(task.max_episode_steps or 1000):
        action, _ = policy.act(observation, explore=explore)
        action = device.action_spec.clip(action)
        next_observation = device.step(action)
        total += task.reward(observation, action, next_observation)
        observation = next_observation
        observations.append(observation)
        if task.terminated(observation):
            break
    return total, observations


def evaluate(device: Device, task: Task, policy: Policy, episodes: int, seed: int) -> dict:
    """Mean return and task metrics over ``episodes`` seeded episodes."""
    returns, metrics = [], {}
    for i in range(episodes):
        total, observations = run_episode(device, task, policy, seed + i)
        returns.append(total)
        for name, value in task.episode_metrics(observations).items():
            metrics.setdefault(name, []).append(value)
    result = {"return_mean": float(np.mean(returns)), "return_std": float(np.std(returns)),
              "returns": [float(r) for r in returns]}
    result.update({f"{name}_mean": float(np.mean(v)) for name, v in metrics.items()})
    return result
