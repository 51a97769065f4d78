"""``embodyrl bench crossq``: what a CrossQ update costs, against SBX's CrossQ doing the same update.

Both sides run one jitted call of K CrossQ updates (critics every update, the actor and the
temperature every third; batch 256; actor 256x256) on HalfCheetah's shapes (17 observations, 6
actions) with the critics 256 and 2048 wide (the paper's width), on batches already in memory:
embodyrl's ``update_many`` on stacked batches, SBX's ``CrossQ.train(gradient_steps=K)`` on its
replay buffer filled with random rows. Blocks alternate between the sides; each figure is the
median over blocks of milliseconds per update, and ``crossq_vs_sbx_wN`` is ours over SBX's
(below 1: ours is faster). SBX is the ``[compare]`` extra, never a dependency: without it the
SBX figures are None and ``sbx`` says why.

The figure explains the experiment's wall clock on a CPU: at 2048 wide, 100k updates are hours;
on a GPU the width is cheap. ``sac_update_ms`` is SAC's update at 256x256 on the same shapes, the
scale the other learning results were taken at.
"""

from __future__ import annotations

import statistics

import jax
import numpy as np

from ..hal.specs import ArraySpec, DictSpec
from . import median_seconds

OBSERVATION, ACTIONS, BATCH = 17, 6, 256


def _specs() -> tuple[DictSpec, ArraySpec]:
    return (DictSpec.of(ArraySpec("observation", (OBSERVATION,), np.float32)),
            ArraySpec("action", (ACTIONS,), np.float32, [-1.0] * ACTIONS, [1.0] * ACTIONS))


def _batches(rng, k: int, batch: int) -> dict:
    def obs():
        return {"observation": rng.normal(size=(k, batch, OBSERVATION)).astype(np.float32)}

    return jax.device_put({"observation": obs(), "next_observation": obs(),
                           "action": rng.uniform(-1, 1, (k, batch, ACTIONS)).astype(np.float32),
                           "reward": rng.normal(size=(k, batch)).astype(np.float32),
                           "discount": np.full((k, batch), 0.99, np.float32)})


def _ours(config, k: int, batch: int):
    """A timed call of K updates of the algorithm ``config`` configures (jitted and warmed up)."""
    from ..algos.registry import as_algorithm

    algorithm = as_algorithm(config)
    networks, state = algorithm.init(jax.random.key(0), *_specs())
    update_many = jax.jit(algorithm.make_update_many(networks))
    batches = _batches(np.random.default_rng(0), k, batch)
    jax.block_until_ready(update_many(state, batches))
    return lambda: jax.block_until_ready(update_many(state, batches))


def _sbx(width: int, k: int, batch: int):
    """A timed call of SBX's ``CrossQ.train`` of K updates, or the reason there is none."""
    try:
        import gymnasium as gym
        import sbx
    except ImportError as error:
        return f"not installed ({error.name}): pip install -e '.[compare]'"
    env = gym.make("HalfCheetah-v5")  # its spaces only: train() samples the buffer, no simulator is timed
    model = sbx.CrossQ("MlpPolicy", env, learning_starts=0, batch_size=batch, learning_rate=1e-3, policy_delay=3,
                       policy_kwargs={"net_arch": {"pi": [256, 256], "qf": [width, width]},
                                      "optimizer_kwargs": {"b1": 0.5}}, seed=0, verbose=0)
    model._setup_learn(total_timesteps=10**6)  # what learn() sets up before it trains (the logger among it)
    rng = np.random.default_rng(0)
    for _ in range(2 * batch):
        model.replay_buffer.add(rng.normal(size=(1, OBSERVATION)), rng.normal(size=(1, OBSERVATION)),
                                rng.uniform(-1, 1, (1, ACTIONS)), rng.normal(size=1), np.zeros(1), [{}])
    for _ in range(3):  # compiles once per actor-step offset ((updates + 1) % policy_delay is static)
        model.train(gradient_steps=k, batch_size=batch)
    return lambda: model.train(gradient_steps=k, batch_size=batch)  # returns once its results are read back


def run(quick: bool = False) -> dict:
    from ..algos import crossq, sac

    k, blocks, batch = (2, 2, 32) if quick else (8, 5, BATCH)
    widths = (64,) if quick else (256, 2048)
    result: dict = {"updates_per_call": k, "batch_size": batch, "blocks": blocks, "widths": list(widths)}
    calls = {"sac_update": _ours(sac.SACConfig(hidden_sizes=(64, 64) if quick else (256, 256), batch_size=batch), k, batch)}
    for width in widths:
        calls[f"crossq_w{width}"] = _ours(crossq.CrossQConfig(critic_hidden_sizes=(width, width), batch_size=batch),
                                          k, batch)
        other = _sbx(width, k, batch)
        if isinstance(other, str):
            result["sbx"] = other
        else:
            calls[f"sbx_w{width}"] = other
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(blocks):
        for name, call in calls.items():
            times[name].append(median_seconds(call, 2) / k)
    ms = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    result["sac_update_ms"] = round(ms["sac_update"], 3)
    for width in widths:
        ours, theirs = ms[f"crossq_w{width}"], ms.get(f"sbx_w{width}")
        result[f"crossq_update_ms_w{width}"] = round(ours, 3)
        result[f"sbx_crossq_update_ms_w{width}"] = None if theirs is None else round(theirs, 3)
        result[f"crossq_vs_sbx_w{width}"] = None if theirs is None else round(ours / theirs, 3)
        result[f"crossq_vs_sac_w{width}"] = round(ours / ms["sac_update"], 2)
        result[f"hours_per_100k_updates_w{width}"] = round(ours * 1e5 / 3.6e6, 2)
    return result
