"""Synchronous PPO with an actor that drives two devices (a ``DeviceGroup``): both streams complete each
iteration, nothing is acted by replaced weights, and the credit never deadlocks the group.

The learner runs here; the actor in a spawned process over loopback ZeroMQ, as ``embodyrl train`` runs it.
"""

import dataclasses
import json
import multiprocessing

from embodyrl.algos.ppo import PPOConfig
from embodyrl.config import LearnerConfig, TrainConfig
from embodyrl.hal.actor import ActorConfig

MEMBERS = ("left", "right")  # two pendulums, device ids 0 and 1


def _config(steps: int) -> TrainConfig:
    return TrainConfig(task="pendulum", algorithm="ppo", steps=steps, seed=0,
                       ppo=PPOConfig(rollout_length=32, rollouts_per_iteration=4, epochs=2, minibatches=4,
                                     hidden_sizes=(16,), max_staleness=0),
                       learner=LearnerConfig(credit_quantum=32, log_every_s=0.2, checkpoint_every_s=3600.0),
                       actor=ActorConfig(send_every=16))


def _actor(endpoint: str, steps: int) -> None:
    from embodyrl import envs
    from embodyrl.hal.actor import ActorLoop
    from embodyrl.hal.group import DeviceGroup
    from embodyrl.hal.wire.client import LearnerLink
    from embodyrl.hal.wire.protocol import DeviceInfo
    from embodyrl.policy import JaxPolicy

    config = _config(steps)
    made = {name: envs.make("pendulum") for name in MEMBERS}
    group = DeviceGroup({n: d for n, (d, _) in made.items()}, {n: i for i, n in enumerate(MEMBERS)})
    policies = {n: JaxPolicy.for_specs(d.observation_spec, d.action_spec, config.algo, seed=i)
                for i, (n, (d, _)) in enumerate(made.items())}
    infos = [DeviceInfo(i, n, made[n][0].observation_spec, made[n][0].action_spec) for i, n in enumerate(MEMBERS)]
    loop_config = dataclasses.replace(config.actor, actor_id=1, random_steps=0, act_within_credit=True,
                                      credit_timeout_s=120.0)
    link = LearnerLink(endpoint, actor_name="pair", actor_id=1, devices=infos)
    with group, link:
        loop = ActorLoop(group, {n: t for n, (_, t) in made.items()}, policies, link, loop_config)
        loop.run()


def test_sync_ppo_with_a_two_device_actor_completes_every_iteration_on_fresh_rows(tmp_path):
    from embodyrl import envs
    from embodyrl.hal.layout import Layout
    from embodyrl.learner import build_learner

    steps = 1500
    device, _ = envs.make("pendulum")
    learner = build_learner(_config(steps), Layout.of("pendulum", device.observation_spec, device.action_spec), tmp_path)
    actor = multiprocessing.get_context("spawn").Process(target=_actor, args=(learner.endpoint, steps))
    actor.start()
    try:
        counters = learner.run(should_stop=lambda: actor.exitcode not in (None, 0))
        actor.join(timeout=60)
    finally:
        if actor.is_alive():
            actor.terminate()
            actor.join(10)
    assert actor.exitcode == 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = lines[-1]
    assert counters.env_steps >= steps and last["updates"] >= 3
    trained = [m for m in lines if "staleness_max" in m]
    assert trained and all(m["staleness_max"] == 0 for m in trained)
    assert last["rows_behind"] == 0  # no row acted by weights the learner had replaced
    # per iteration and stream at most the one transition whose successor closed the segment
    assert 0 < last["discarded"] <= len(MEMBERS) * last["policy_version"]
