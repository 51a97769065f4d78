"""Actor-side helpers the link tests run in child processes (spawned, so importable)."""

from __future__ import annotations

import numpy as np

from embodyrl.hal.steps import NO_POLICY


class LinearPolicy:
    """action = tanh(W @ features): a numpy policy whose weights the learner sends."""

    def __init__(self):
        self.version = NO_POLICY
        self.w = np.zeros((1, 3), np.float32)

    def act(self, observation, *, explore: bool):
        x = np.concatenate([observation["angular_velocity"], observation["orientation"]])
        return (2 * np.tanh(self.w @ x)).astype(np.float32), {}

    def load_weights(self, version, arrays):
        self.w = np.array(arrays["w"], np.float32)
        self.version = version


def run_actor(endpoint: str, actor_id: int, result_queue) -> None:
    from embodyrl import envs
    from embodyrl.hal.actor import ActorConfig, ActorLoop
    from embodyrl.hal.wire.client import LearnerLink
    from embodyrl.hal.wire.protocol import DeviceInfo

    device, task = envs.make("pendulum")
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink(endpoint, actor_name=f"test-{actor_id}", actor_id=actor_id, devices=[info],
                       handshake_timeout_s=20, peer_timeout_s=20)
    policy = LinearPolicy()
    with device, link:
        loop = ActorLoop(device, task, policy, link, ActorConfig(actor_id=actor_id, send_every=32,
                                                                 random_steps=0, seed=actor_id))
        stats = loop.run()
    result_queue.put({"actor_id": actor_id, "env_steps": stats.env_steps,
                      "weight_updates": stats.weight_updates, "version": list(policy.version),
                      "bye": link.bye_reason, "w": policy.w.tolist()})


def row_keys(steps) -> list[tuple[int, int]]:
    return list(zip(steps.episode_id.tolist(), steps.step_index.tolist(), strict=True))


def logged_rows(path) -> list[tuple[int, int]]:
    """The row keys a :func:`run_logging_actor` handed to its link."""
    import json

    with open(path) as f:
        return [tuple(k) for line in f for k in json.loads(line)]


def run_logging_actor(endpoint: str, actor_id: int, spool_dir: str, log_path: str,
                      max_steps: int, peer_timeout_s: float = 2.0) -> None:
    """An actor that logs the key of every row it hands to the link, then drains its spool."""
    import json

    from embodyrl import envs
    from embodyrl.hal.actor import ActorConfig, ActorLoop
    from embodyrl.hal.wire.client import LearnerLink
    from embodyrl.hal.wire.protocol import DeviceInfo
    from embodyrl.hal.wire.spool import Spool

    device, task = envs.make("pendulum")
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink(endpoint, actor_name=f"log-{actor_id}", actor_id=actor_id, devices=[info],
                       handshake_timeout_s=30, peer_timeout_s=peer_timeout_s, reconnect_s=0.2,
                       reconnect_max_s=0.5, spool=Spool(spool_dir))
    original = link.send_steps
    log = open(log_path, "a")  # noqa: SIM115 (open for the life of the process)

    def logged(device_id, steps):
        seq = original(device_id, steps)
        log.write(json.dumps(row_keys(steps)) + "\n")
        log.flush()
        return seq

    link.send_steps = logged
    with device:
        link.connect()
        loop = ActorLoop(device, task, LinearPolicy(), link,
                         ActorConfig(actor_id=actor_id, send_every=16, random_steps=0, seed=actor_id,
                                     credit_timeout_s=60))
        loop.run(max_steps=max_steps)
        assert link.flush(60), "spool never drained"
        link.close()
