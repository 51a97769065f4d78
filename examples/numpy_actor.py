"""Act with an exported policy using numpy alone (no JAX): a small robot PC's actor.

Export a trained policy once on the learner's machine::

    embodyrl export runs/pendulum pendulum_policy

then, where only the base install is present::

    python examples/numpy_actor.py pendulum_policy --task pendulum --episodes 3
    python examples/numpy_actor.py arm_policy --task arm_reach --remote tcp://robot-box:5556 \
        --secret-key keys/actor.key_secret --server-key keys/robot.key
    python examples/numpy_actor.py arm_policy --task arm.yaml    # your robot's file (docs/robots.md)

``--task`` takes what ``embodyrl train`` takes: a task name, ``module:factory``
or a robot file (its device, safety limits and task; reading it needs pyyaml).
With ``--remote`` the device is the robot server's (the task still computes
the reward here); otherwise the task's own device. Off loopback
the robot server takes CurveZMQ keys (``embodyrl keys``; see
``examples/remote_robot_driver.py``); ``--insecure`` allows plain TCP.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from embodyrl import robot
from embodyrl.hal import runtime


def run_episode(device, task, policy, max_steps: int, explore: bool) -> float:
    observation = device.reset()
    total = 0.0
    for _ in range(max_steps):
        action, _ = policy.act(observation, explore=explore)
        next_observation = device.step(action)
        total += task.reward(observation, action, next_observation)
        observation = next_observation
        if task.terminated(observation):
            break
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run an exported policy with numpy.")
    parser.add_argument("export", help="path of the export (.json + .npz, suffix optional)")
    parser.add_argument("--task", default="pendulum",
                        help="a task name, module:factory or robot file ROBOT.yaml (default pendulum)")
    parser.add_argument("--remote", help="endpoint of a robot server to drive instead of the simulator")
    parser.add_argument("--secret-key", help="this actor's .key_secret (CurveZMQ) for --remote")
    parser.add_argument("--server-key", help="the robot server's public .key for --remote")
    parser.add_argument("--insecure", action="store_true", help="allow plain TCP off loopback for --remote")
    parser.add_argument("--episodes", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--explore", action="store_true", help="add the policy's exploration noise")
    args = parser.parse_args(argv)

    policy = runtime.load(args.export, seed=0)
    try:
        device, task = robot.load(args.task).make()
    except ValueError as err:  # an unknown task, a robot file refused by field
        sys.exit(str(err))
    if args.remote:
        from embodyrl.hal.drivers.remote import RemoteDevice
        from embodyrl.hal.wire.security import ClientKeys

        if (args.secret_key is None) != (args.server_key is None):
            sys.exit("--secret-key and --server-key go together")
        keys = ClientKeys(args.secret_key, args.server_key) if args.secret_key else None
        device = RemoteDevice(args.remote, keys=keys, allow_insecure=args.insecure)
    max_steps = args.max_steps or task.max_episode_steps or 1000
    with device:
        if device.observation_spec != policy.observation_spec:
            sys.exit(f"the export reads {list(policy.observation_spec)}, the device gives {list(device.observation_spec)}")
        returns = [run_episode(device, task, policy, max_steps, args.explore) for _ in range(args.episodes)]
    print(json.dumps({"returns": returns, "mean_return": float(np.mean(returns)),
                      "jax_imported": "jax" in sys.modules}))


if __name__ == "__main__":
    main()
