"""A run over devices of different shapes (task ``a+b``): one policy, per-device heads.

``embodyrl train pendulum+arm_reach`` declares device kinds 0 and 1 (a
:class:`~embodyrl.algos.heads.HeteroLayout` built from the tasks' specs); the
learner pads each device's rows into one replay and trains per-device heads
around a shared trunk; every actor drives one device of each task (a
:class:`~embodyrl.hal.group.DeviceGroup`), each acting through its own heads
(:class:`~embodyrl.algos.heads.DevicePolicy`). This module turns a task
string into those pieces, so the learner, the actors and the evaluation of
``embodyrl train`` read the same layout.
"""

from __future__ import annotations

from pathlib import Path

from . import envs


def is_hetero(task: str) -> bool:
    return len(envs.parts(task)) > 1


def member_name(task: str) -> str:
    """A task as a group member's name ('/' separates member and field names)."""
    return task.replace("/", "-")


def layout(task: str):
    """The :class:`~embodyrl.algos.heads.HeteroLayout` of ``task``'s parts, device id = position."""
    from .algos.heads import DeviceKind, HeteroLayout

    kinds = []
    for name in envs.parts(task):
        device, _ = envs.make(name)
        kinds.append(DeviceKind(name, device.observation_spec, device.action_spec))
    return HeteroLayout(tuple(kinds))


def algorithm(config):
    """The run's algorithm over its layout (a :class:`~embodyrl.algos.heads.Headed`: the
    :class:`~embodyrl.algos.interface.Algorithm` interface plus ``layout``)."""
    from .algos.heads import hetero

    return hetero(config.algo, layout(config.task))


def actor_parts(config, seed: int):
    """(group of safe devices, tasks, policies, device infos), all keyed by member name, for one actor."""
    from .algos.heads import DevicePolicy
    from .hal.group import DeviceGroup
    from .hal.safety import SafeDevice, SafetyConfig
    from .hal.wire.protocol import DeviceInfo

    algo = algorithm(config)
    devices, ids, tasks, policies, infos = {}, {}, {}, {}, []
    for device_id, name in enumerate(envs.parts(config.task)):
        member = member_name(name)
        raw, tasks[member] = envs.make(name)
        devices[member], ids[member] = SafeDevice(raw, SafetyConfig()), device_id  # clipping to the spec, counted
        policies[member] = DevicePolicy(algo, device_id, seed=seed + device_id)
        infos.append(DeviceInfo(device_id, name, raw.observation_spec, raw.action_spec))
    return DeviceGroup(devices, ids), tasks, policies, infos


def evaluate_run(config, run_dir: Path, episodes: int | None = None, seed: int | None = None) -> dict:
    """Per device: the saved policy's heads against uniform random actions on the same seeded episodes."""
    from .algos.heads import DevicePolicy
    from .evaluate import versus_random
    from .policy import read_saved

    _, weights, version = read_saved(Path(run_dir) / "policy")
    algo = algorithm(config)
    episodes = config.eval_episodes if episodes is None else episodes
    seed = 10_000 + config.seed if seed is None else seed
    per_device = {}
    for device_id, name in enumerate(envs.parts(config.task)):
        policy = DevicePolicy(algo, device_id, seed=config.seed)
        policy.load_weights(version, weights)
        per_device[name] = versus_random(*envs.make(name), policy, episodes, seed)
    return {"eval_episodes": episodes, "devices": per_device}
