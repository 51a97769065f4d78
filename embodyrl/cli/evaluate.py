"""Evaluate a policy on a (device, task) pair: returns and the task's own metrics."""

from __future__ import annotations

import numpy as np

from ..hal.device import Device
from ..hal.operator import Operator
from ..hal.policy import Policy
from ..hal.task import Task


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


def evaluate(device: Device, task: Task, policy: Policy, episodes: int, seed: int,
             operator: Operator | None = None) -> dict:
    """Mean return and task metrics over ``episodes`` seeded episodes.

    With an ``operator`` (a robot reset by hand) each episode's end holds the
    device safe until the person has reset the scene and answered; a success or
    failure answer is the episode's ``success``, over the task's own signal.
    """
    returns, metrics = [], {}
    for i in range(episodes):
        total, observations = run_episode(device, task, policy, seed + i)
        returns.append(total)
        episode_metrics = task.episode_metrics(observations)
        if operator is not None:
            label = _ask(operator, device, task, observations, f"evaluation episode {i + 1}/{episodes} ended "
                                                                f"after {len(observations) - 1} steps, return {total:.2f}")
            if label is not None:
                episode_metrics["success"] = float(label)
        for name, value in episode_metrics.items():
            metrics.setdefault(name, []).append(value)
    result = {"return_mean": float(np.mean(returns)), "return_std": float(np.std(returns)),
              "returns": [float(r) for r in returns]}
    result.update(summarise(metrics))
    return result


def summarise(metrics: dict[str, list[float]]) -> dict[str, float]:
    """Each task metric over the episodes: one named ``*_median`` by its median over the episodes'
    values (an outlier episode must not move it), any other by its mean, its key gaining ``_mean``."""
    out = {}
    for name, values in metrics.items():
        if name.endswith("_median"):
            out[name] = float(np.median(values))
        else:
            out[f"{name}_mean"] = float(np.mean(values))
    return out


def _ask(operator: Operator, device: Device, task: Task, observations, summary: str) -> bool | None:
    """The person's label of a finished episode (None: go, the task's signal stands), the device
    holding its safe action meanwhile."""
    from ..hal.device import hold_safe
    from ..hal.operator import task_success, wait_for_answer

    answer = wait_for_answer(operator, summary, allow_go=task_success(task, observations) is not None,
                             every=lambda: hold_safe(device), period_s=device.control_period_s)
    return answer.success


def versus_random(device: Device, task: Task, policy: Policy, episodes: int, seed: int) -> dict:
    """``policy`` and a uniform random policy on the same seeded episodes: ``eval_*`` and ``random_*`` figures."""
    from ..hal.policy import UniformRandomPolicy

    with device:
        trained = evaluate(device, task, policy, episodes, seed)
        rand = evaluate(device, task, UniformRandomPolicy(device.action_spec, seed=seed), episodes, seed)
    out = {"eval_return_mean": trained["return_mean"], "random_return_mean": rand["return_mean"],
           "eval_returns": trained["returns"]}
    for name, value in trained.items():
        if name.endswith(("_mean", "_median")) and name != "return_mean":
            out[f"eval_{name.removesuffix('_mean')}"] = value
            out[f"random_{name.removesuffix('_mean')}"] = rand[name]
    return out


def evaluate_saved_run(run_dir, episodes: int | None = None, seed: int | None = None,
                       operator: Operator | None = None) -> dict:
    """The saved policy of ``run_dir`` on each device kind of its task: mean return and task metrics
    (``operator``: a person resets the scene between episodes and labels them)."""
    from pathlib import Path

    from ..config import load
    from ..policy import load_run_policies
    from ..robot import of_config

    run_dir = Path(run_dir)
    config = load(run_dir / "config.json")
    episodes = config.eval_episodes if episodes is None else episodes
    seed = eval_seed(config) if seed is None else seed
    robot = of_config(config)  # as config.json recorded it; a robot file changed since is refused
    policies = load_run_policies(run_dir, config.algo, robot.layout(), seed=config.seed)
    return {"task": config.task, "algorithm": config.algorithm, "episodes": episodes, "seed": seed,
            "policy_version": list(policies[0].version), **per_kind(robot, policies, episodes, seed, operator)}


def eval_seed(config) -> int:
    """The first seeded episode a run's policies are evaluated on (then +1 per episode): apart from
    the seeds its actors trained on."""
    return 10_000 + config.seed


def per_kind(robot, policies, episodes: int, seed: int, operator: Operator | None = None) -> dict:
    """:func:`evaluate` of each device kind's policy (by device id) on its own device, as the run
    reports figures by kind (:meth:`~embodyrl.hal.layout.Layout.collect`)."""
    layout = robot.layout()
    results = {}
    for kind, policy in zip(layout.kinds, policies, strict=True):
        device, task = robot.make(kind.name)
        with device:
            results[kind.name] = evaluate(device, task, policy, episodes, seed, operator)
    return layout.collect(results)


def versus_random_run(config, run_dir) -> dict:
    """The saved policy and a uniform random policy on the same seeded episodes, per device kind
    (what ``embodyrl train`` writes into ``summary.json``)."""
    from ..policy import load_run_policies
    from ..robot import of_config

    robot = of_config(config)
    layout = robot.layout()
    policies = load_run_policies(run_dir, config.algo, layout, seed=config.seed)
    results = {kind.name: versus_random(*robot.make(kind.name), policy, config.eval_episodes, eval_seed(config))
               for kind, policy in zip(layout.kinds, policies, strict=True)}
    return {"eval_episodes": config.eval_episodes, **layout.collect(results)}


def evaluate_snapshots(config, run_dir) -> list[dict]:
    """Each policy snapshot of the run (``eval_every``) on the final evaluation's seeded episodes;
    the rows are written to ``run_dir/eval.jsonl`` and returned (env steps, updates, return)."""
    import json
    from pathlib import Path

    from ..learner.snapshots import kept
    from ..policy import load_policies
    from ..robot import of_config

    robot = of_config(config)
    rows = []
    for meta, directory in kept(run_dir):
        policies = load_policies(directory, config.algo, robot.layout(), seed=config.seed)
        rows.append({"env_steps": meta["env_steps"], "updates": meta["updates"],
                     **per_kind(robot, policies, config.eval_episodes, eval_seed(config))})
    Path(run_dir, "eval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def render_strip(run_dir, path, frames: int = 8, size: tuple[int, int] = (160, 120),
                 seed: int | None = None, device: str | None = None) -> dict:
    """One episode of the saved policy, ``frames`` evenly spaced images side by side in a PNG.

    ``device``: which device kind to show (None: the only one). Rendered offscreen with MuJoCo
    (the device must be a ``MujocoDevice``), from the model's first MJCF camera, else MuJoCo's
    free camera.
    """
    from pathlib import Path

    import mujoco

    from ..config import load
    from ..policy import load_run_policies
    from ..robot import of_config

    run_dir = Path(run_dir)
    config = load(run_dir / "config.json")
    robot = of_config(config)
    layout = robot.layout()
    device_id = layout.index(device)
    name = layout.kinds[device_id].name
    device, task = robot.make(name)
    device = getattr(device, "inner", device)  # a robot file's device: the simulation inside its safety layer
    if not hasattr(device, "model") or not hasattr(device, "data"):
        raise ValueError(f"task {name!r}: its device is not a MuJoCo simulation; nothing to render")
    policy = load_run_policies(run_dir, config.algo, layout, seed=config.seed)[device_id]
    seed = eval_seed(config) if seed is None else seed
    camera = mujoco.mj_id2name(device.model, mujoco.mjtObj.mjOBJ_CAMERA, 0) if device.model.ncam else -1
    images = []
    with device:
        renderer = mujoco.Renderer(device.model, height=size[1], width=size[0])
        try:
            observation = device.reset(seed=seed)
            limit = task.max_episode_steps or 1000
            picks = set(np.linspace(0, limit, frames, dtype=int).tolist())
            total = 0.0
            for step in range(limit + 1):
                if step in picks:
                    renderer.update_scene(device.data, camera=camera)
                    images.append(renderer.render().copy())
                if step == limit:
                    break
                action, _ = policy.act(observation, explore=False)
                action = device.action_spec.clip(action)
                next_observation = device.step(action)
                total += task.reward(observation, action, next_observation)
                observation = next_observation
                if task.terminated(observation):
                    renderer.update_scene(device.data, camera=camera)
                    images.append(renderer.render().copy())
                    break
        finally:
            renderer.close()
    strip = np.concatenate(images, axis=1)
    write_png(Path(path), strip)
    return {"strip": str(path), "frames": len(images), "width": int(strip.shape[1]),
            "height": int(strip.shape[0]), "camera": camera if camera != -1 else "free",
            "strip_return": float(total)}


def write_png(path, image: np.ndarray) -> None:
    """An RGB uint8 image as a PNG file (zlib only: no imaging library needed)."""
    import struct
    import zlib

    height, width, channels = image.shape
    if channels != 3 or image.dtype != np.uint8:
        raise ValueError(f"write_png: expected an RGB uint8 image, got {image.dtype} {image.shape}")
    raw = b"".join(b"\x00" + image[row].tobytes() for row in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                     + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
