"""One TD3 policy trained on two robots of different shapes at once.

The pendulum (3 observation values, 1 torque) and the 7-DoF arm reach task
(20 observation values, 7 torques) stream to one learner as devices 0 and 1
of one actor (a ``DeviceGroup``). The learner declares both kinds
(:class:`~embodyrl.hal.layout.Layout`), pads each device's rows into
one replay, and trains per-device input and output heads around a shared
trunk (:mod:`embodyrl.algos.heads`). The actor runs in its own process
(``spawn``), over ZeroMQ on loopback, as in ``embodyrl train``.

    python examples/heterogeneous_robots.py --steps 4000 --run-dir /tmp/hetero

Prints one JSON object: per device, the mean return of the learned policy and
of a random one over a few evaluation episodes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
from pathlib import Path

DEVICES = ("pendulum", "arm_reach")  # device id = position


def layout():
    """Device kinds 0 and 1 from the tasks' specs (``embodyrl train pendulum+arm_reach`` builds the same)."""
    from embodyrl import envs

    return envs.layout(envs.SEPARATOR.join(DEVICES))


def config(steps: int, seed: int):
    from embodyrl import envs
    from embodyrl.algos.ddpg import DDPGConfig
    from embodyrl.config import LearnerConfig, TrainConfig

    return TrainConfig(task=envs.SEPARATOR.join(DEVICES), algorithm="td3", steps=steps, seed=seed,
                       ddpg=DDPGConfig(hidden_sizes=(64, 64), discount=0.98, batch_size=128),
                       learner=LearnerConfig(min_replay=500, replay_capacity=8192, replay_chunk_rows=1024,
                                             checkpoint_every_s=3600.0, publish_every=16))


def actor_main(endpoint: str, steps: int, seed: int) -> None:
    """Both robots as one actor: each device acts through its own heads of the shared policy."""
    from embodyrl import envs
    from embodyrl.hal.actor import ActorConfig, ActorLoop
    from embodyrl.hal.group import DeviceGroup
    from embodyrl.hal.safety import SafeDevice, SafetyConfig
    from embodyrl.hal.wire.client import LearnerLink
    from embodyrl.hal.wire.protocol import DeviceInfo
    from embodyrl.policy import JaxPolicy

    algorithm, kinds = config(steps, seed).algo, layout()
    made = {name: envs.make(name) for name in DEVICES}
    devices = {name: SafeDevice(device, SafetyConfig()) for name, (device, _) in made.items()}
    group = DeviceGroup(devices, {name: i for i, name in enumerate(DEVICES)})
    infos = [DeviceInfo(i, name, devices[name].observation_spec, devices[name].action_spec)
             for i, name in enumerate(DEVICES)]
    policies = {name: JaxPolicy(algorithm, kinds, i, seed=seed + i) for i, name in enumerate(DEVICES)}
    link = LearnerLink(endpoint, actor_name="robots", actor_id=1, devices=infos)
    loop_config = ActorConfig(actor_id=1, random_steps=250, seed=seed, send_every=32, credit_timeout_s=300.0)
    with group, link:
        loop = ActorLoop(group, {n: t for n, (_, t) in made.items()}, policies, link, loop_config)
        loop.run(max_steps=steps)
        link.flush(10.0)


def evaluate(weights: dict, steps: int, seed: int, episodes: int) -> dict:
    """Mean return per device: the learned policy (no exploration) against uniform random actions."""
    from embodyrl import envs
    from embodyrl.cli.evaluate import versus_random
    from embodyrl.hal.steps import PolicyVersion
    from embodyrl.policy import JaxPolicy

    algorithm, kinds = config(steps, seed).algo, layout()
    result = {}
    for i, name in enumerate(DEVICES):
        policy = JaxPolicy(algorithm, kinds, i)
        policy.load_weights(PolicyVersion(0, 1), weights)
        figures = versus_random(*envs.make(name), policy, episodes, 10_000 + seed)
        result[name] = {"learned_return_mean": figures["eval_return_mean"],
                        "random_return_mean": figures["random_return_mean"]}
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000, help="environment steps, both robots together")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=2, help="evaluation episodes per device")
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    from embodyrl.learner import build_learner

    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="hetero-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    hetero_layout = layout()
    learner = build_learner(config(args.steps, args.seed), hetero_layout, run_dir)
    context = multiprocessing.get_context("spawn")
    actor = context.Process(target=actor_main, args=(learner.endpoint, args.steps, args.seed), name="robots")
    actor.start()
    try:
        counters = learner.run(should_stop=lambda: not actor.is_alive() and actor.exitcode not in (0, None))
        actor.join(timeout=60)
    finally:
        if actor.is_alive():
            actor.terminate()
            actor.join(timeout=10)
    if actor.exitcode != 0:
        raise RuntimeError(f"the actor process exited with code {actor.exitcode}")
    summary = {"env_steps": counters.env_steps, "updates": counters.updates, "run_dir": str(run_dir),
               "devices": {name: {"observation_size": n, "action_size": m}
                           for name, n, m in zip(DEVICES, hetero_layout.observation_sizes,
                                                 hetero_layout.action_sizes, strict=True)},
               "evaluation": evaluate(learner.training.actor_weights(), args.steps, args.seed, args.episodes)}
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
