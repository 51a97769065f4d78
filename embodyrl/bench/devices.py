"""The learner's update split over 1, 2 and 4 devices (``learner.devices``), side by side.

A child process is started with ``--xla_force_host_platform_device_count=4`` (so every count runs
under the same XLA flags) and builds the training the learner builds
(:meth:`~embodyrl.learner.service.Training.of`, DDPG at the pendulum's defaults: 256x256, batch 256,
K=16 updates per call) once per device count, then times their updates in alternating blocks on a
batch already placed, each rate over all its blocks.

What this shows: the cost of the sharded path itself (splitting the batch, the gradients'
all-reduce, the replicated optimiser step) on this machine. What it does not show: a speed-up.
Forced CPU devices are slices of the same cores, so four of them do the same arithmetic on the
same two cores, plus the collectives; on a host with N accelerators each device brings its own
compute and the update's time falls towards 1/N of it for batches large enough to fill them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

COUNTS = (1, 2, 4)


def run(quick: bool = False) -> dict:
    """``sharded_updates_per_s`` per device count and each count's rate over one device's."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={max(COUNTS)}",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "embodyrl.bench.devices", "quick" if quick else "full"],
                          capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the devices bench failed: {proc.stderr[-2000:]}")
    rates = json.loads(proc.stdout.splitlines()[-1])
    return {"sharded_updates_per_s": rates,
            **{f"sharded_vs_one_device_{n}": round(rates[str(n)] / rates["1"], 3) for n in COUNTS[1:]},
            "sharded_devices": "forced CPU devices sharing this machine's cores"}


def _measure(quick: bool) -> dict[str, float]:
    import dataclasses

    import jax
    import numpy as np

    from ..algos import registry
    from ..config import default_config
    from ..envs import layout as task_layout
    from ..learner.devices import Placement, resolve
    from ..learner.service import Training

    config = dataclasses.replace(default_config("pendulum"), algorithm=registry.DEFAULT)
    algo, lc = config.algo, config.learner
    layout = task_layout("pendulum")
    k, batch = lc.updates_per_call, algo.batch_size
    rng = np.random.default_rng(0)

    def observation():
        return {name: rng.normal(size=(k, batch, *spec.shape)).astype(spec.dtype)
                for name, spec in layout.observation_spec.items()}

    data = {"observation": observation(), "next_observation": observation(),
            "action": rng.uniform(-2, 2, (k, batch, 1)).astype(np.float32),
            "reward": rng.normal(size=(k, batch)).astype(np.float32),
            "discount": np.full((k, batch), algo.discount, np.float32)}
    trainings = {}
    for count in COUNTS:
        placement = Placement(resolve(count), batch_size=batch)
        training = Training.of(algo, layout.observation_spec, layout.action_spec, config.seed, placement=placement,
                               updates_per_call=k, publish_every=lc.publish_every)
        resident = jax.device_put(data, placement.sharded) if count > 1 else jax.device_put(data)
        training.compile(resident)
        trainings[count] = (training, resident)
    blocks, calls = (4, 3) if quick else (12, 10)
    spent = dict.fromkeys(COUNTS, 0.0)
    for block in range(blocks):
        order = COUNTS if block % 2 == 0 else COUNTS[::-1]
        for count in order:
            training, resident = trainings[count]
            started = time.perf_counter()
            for _ in range(calls):
                training.update(resident)
            jax.block_until_ready(training.state)
            spent[count] += time.perf_counter() - started
    return {str(count): round(blocks * calls * k / spent[count], 1) for count in COUNTS}


if __name__ == "__main__":
    print(json.dumps(_measure(sys.argv[1:] == ["quick"])))
