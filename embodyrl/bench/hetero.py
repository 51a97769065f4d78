"""``embodyrl bench hetero``: what one policy over devices of different shapes costs.

Learner: one jitted SAC ``update_many`` (K updates in a ``lax.scan``) on the
headed networks of pendulum + arm (:mod:`embodyrl.algos.heads_sac`), its
batches mixing both devices' padded rows, against the same update on the
plain networks of the arm alone (the baseline: one device, no heads, no
padding), same trunk and batch, alternating blocks in one run; medians per
update. The ratio is the price of running every device's heads on every
row and keeping each row's own.

Actor: one action of the arm through :class:`~embodyrl.policy.JaxPolicy` over
the two-kind layout (pad, headed forward, slice, scale) against the same class
on the arm's own one-kind layout.
"""

from __future__ import annotations

import statistics

import jax
import numpy as np

from .. import envs
from ..algos import sac
from ..algos.heads import over
from ..algos.registry import as_algorithm
from . import median_seconds

TASK = "pendulum+arm_reach"
TASKS = envs.parts(TASK)
ARM = 1


def _specs(layout) -> list:
    """(observation spec, action spec) of each device kind, by device id."""
    return [(kind.observation_spec, kind.action_spec) for kind in layout.kinds]


def _random_observation(rng, spec, lead):
    return {s.name: rng.normal(size=(*lead, *s.shape)).astype(np.float32) for s in spec.specs}


def _batches(rng, layout, specs, k: int, n: int, hetero_rows: bool) -> dict:
    """K batches of n rows: both devices' padded rows alternating, or the arm's own rows."""
    def observations():
        if not hetero_rows:
            return _random_observation(rng, specs[ARM][0], (k, n))
        rows = [layout.pad_observation(d, _random_observation(rng, specs[d][0], (k,)))
                for d in (np.arange(n) % len(TASKS))]
        return jax.tree.map(lambda *xs: np.stack(xs, axis=1), *rows)

    width = layout.action_spec.shape[0] if hetero_rows else specs[ARM][1].shape[0]
    return jax.device_put({"observation": observations(), "next_observation": observations(),
                           "action": rng.uniform(-1, 1, (k, n, width)).astype(np.float32),
                           "reward": rng.normal(size=(k, n)).astype(np.float32),
                           "discount": np.full((k, n), 0.99, np.float32)})


def learner_side(quick: bool) -> dict:
    k, blocks = (2, 2) if quick else (8, 5)
    config = sac.SACConfig(hidden_sizes=(32, 32) if quick else (256, 256), batch_size=16 if quick else 256)
    layout = envs.layout(TASK)
    specs = _specs(layout)
    rng = np.random.default_rng(0)
    algo = over(as_algorithm(config), layout)
    headed, headed_state = algo.init(jax.random.key(0), layout.observation_spec, layout.action_spec)
    plain, plain_state = sac.init(jax.random.key(0), *specs[ARM], config)
    calls = {}
    for name, networks, state, rows in (("hetero", headed, headed_state, True), ("single", plain, plain_state, False)):
        batches = _batches(rng, layout, specs, k, config.batch_size, rows)
        update_many = jax.jit(sac.make_update_many(networks, config))
        jax.block_until_ready(update_many(state, batches))
        calls[name] = (update_many, state, batches)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(blocks):
        for name, (update_many, state, batches) in calls.items():
            times[name].append(median_seconds(
                lambda f=update_many, s=state, b=batches: jax.block_until_ready(f(s, b)), 2) / k)
    hetero_s, single_s = statistics.median(times["hetero"]), statistics.median(times["single"])
    return {"hetero_update_ms": round(1e3 * hetero_s, 3), "single_update_ms": round(1e3 * single_s, 3),
            "hetero_update_ratio": round(hetero_s / single_s, 3), "device_kinds": len(TASKS),
            "batch_size": config.batch_size, "updates_per_call": k, "hidden_sizes": list(config.hidden_sizes)}


def actor_side(quick: bool) -> dict:
    from ..policy import JaxPolicy

    steps = 30 if quick else 300
    config = sac.SACConfig(hidden_sizes=(32, 32) if quick else (256, 256))
    layout = envs.layout(TASK)
    observation_spec, action_spec = _specs(layout)[ARM]
    observation = _random_observation(np.random.default_rng(1), observation_spec, ())
    policies = {"hetero": JaxPolicy(config, layout, ARM),
                "single": JaxPolicy.for_specs(observation_spec, action_spec, config)}
    times: dict[str, list[float]] = {name: [] for name in policies}
    for policy in policies.values():
        policy.act(observation)  # compile
    for _ in range(3):
        for name, policy in policies.items():
            times[name].append(median_seconds(lambda p=policy: p.act(observation), steps // 3))
    hetero_s, single_s = statistics.median(times["hetero"]), statistics.median(times["single"])
    return {"hetero_act_ms": round(1e3 * hetero_s, 3), "single_act_ms": round(1e3 * single_s, 3),
            "hetero_act_ratio": round(hetero_s / single_s, 3)}


def run(quick: bool = False) -> dict:
    return {**learner_side(quick), **actor_side(quick)}
