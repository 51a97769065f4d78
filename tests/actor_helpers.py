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
