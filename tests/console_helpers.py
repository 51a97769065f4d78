"""A console run in pieces for tests: actors in threads of the test (the console runs in its own process)."""

from __future__ import annotations

import time

import numpy as np

from embodyrl.console.process import ConsoleProcess, LoopThread, free_port  # noqa: F401 - the tests' too
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.console import ConsoleLink
from embodyrl.hal.device import Device
from embodyrl.hal.intervention import ScriptedIntervention
from embodyrl.hal.link import NullLink
from embodyrl.hal.policy import UniformRandomPolicy
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.task import Task


class CameraToy(Device):
    """A point that the action moves, seen by a 48 x 64 camera; its safe action is rest. It keeps
    the time its e-stop commanded the safe state (what an e-stop's latency ends at)."""

    def __init__(self, name: str = "toy"):
        super().__init__()
        self.name = name
        self.observation_spec = DictSpec([ArraySpec("position", (2,), np.float32),
                                          ArraySpec("camera/front", (48, 64, 3), np.uint8)])
        self.action_spec = ArraySpec("velocity", (2,), np.float32, minimum=-1.0, maximum=1.0)
        self.control_period_s = 0.01
        self.safe_action = np.zeros(2, np.float32)
        self.position = np.zeros(2, np.float32)
        self.estopped_at: list[float] = []

    def _observe(self):
        image = np.zeros((48, 64, 3), np.uint8)
        x, y = (np.clip(self.position, -1, 1) * [30, 22] + [32, 24]).astype(int)
        image[max(y - 3, 0):y + 3, max(x - 3, 0):x + 3] = (255, 120, 0)
        return {"position": self.position.copy(), "camera/front": image}

    def _reset(self, seed):
        self.position = np.zeros(2, np.float32)
        return self._observe()

    def _step(self, action):
        self.position = np.clip(self.position + 0.05 * action, -1, 1).astype(np.float32)
        return self._observe()

    def _on_estop(self):
        self.estopped_at.append(time.monotonic())


class ShortTask(Task):
    """Episodes of ``length`` steps; reward: closeness to the origin; success: ending near it."""

    def __init__(self, length: int = 20):
        self.max_episode_steps = length

    def reward(self, observation, action, next_observation):
        return float(-np.linalg.norm(next_observation["position"]))

    def terminated(self, next_observation):
        return False

    def episode_metrics(self, observations):
        return {"success": float(np.linalg.norm(observations[-1]["position"]) < 0.3)}


class NeverAnswers:
    """An operator who never answers (the console must)."""

    def ask(self, device_id, summary, *, allow_go=True):
        pass

    def answer(self):
        return None


class ThreadActor(LoopThread):
    """An actor loop in a thread of the test: a SafeDevice(CameraToy), random actions, no learner,
    paced in real time at 100 Hz, dialling the console at ``endpoint``."""

    def __init__(self, endpoint: str, actor_id: int, *, teleop: bool = False, operator: bool = False):
        device = SafeDevice(CameraToy(f"toy-{actor_id}"), SafetyConfig(safe_action=(0.0, 0.0)))
        console = ConsoleLink(endpoint, role="actor", actor_id=actor_id)
        intervention = ScriptedIntervention(rule=lambda t, o: None) if teleop else None
        loop = ActorLoop(device, ShortTask(), UniformRandomPolicy(device.action_spec, seed=actor_id),
                         NullLink(), ActorConfig(actor_id=actor_id, realtime=True, random_steps=10**9),
                         intervention=intervention, operator=NeverAnswers() if operator else None, console=console)
        super().__init__(device, loop, console)


def wait_for(predicate, timeout=20.0, what="the condition"):
    """``predicate()``'s first true value within ``timeout`` seconds, else an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
