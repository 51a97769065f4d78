"""``embodyrl bench algos``: the learner loop against the bare jitted update.

``learner_loop_ratio``: gradient steps per second of the full learner loop
(sample K batches from the persistent replay in the background prefetcher,
stack, transfer, jitted ``update_many``) over the same jitted update on a
batch already resident on the device, same networks (256x256), batch 256,
K=16, same run, alternating blocks so both see the same machine.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from ..algos.ddpg import DDPGConfig
from ..algos.registry import as_algorithm
from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import PolicyVersion, StepRecorder
from ..replay import PersistentReplay, Prefetcher

OBS = DictSpec.of(ArraySpec("state", (17,), np.float32))
ACT = ArraySpec("action", (6,), np.float32, -1, 1)


def _fill(replay: PersistentReplay, rows: int) -> None:
    rng = np.random.default_rng(0)
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0, capacity=1002)
    done = 0
    while done < rows:
        for t in range(1000):
            obs = {"state": rng.normal(size=17).astype(np.float32)}
            a = rng.uniform(-1, 1, 6).astype(np.float32)
            rec.add(obs, a, a, float(rng.normal()), False, t == 999, PolicyVersion(1, 1))
        rec.add_final({"state": rng.normal(size=17).astype(np.float32)})
        steps = rec.flush()
        replay.add(steps)
        done += len(steps)
    replay.commit()


def run(quick: bool = False) -> dict:
    calls, blocks, K = (3, 2, 4) if quick else (20, 5, 16)
    algorithm = as_algorithm(DDPGConfig())
    networks, state = algorithm.init(jax.random.key(0), OBS, ACT)
    update_many = jax.jit(algorithm.make_update_many(networks), donate_argnums=0)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        replay = PersistentReplay(Path(tmp) / "replay", OBS, ACT, capacity=1 << 17, chunk_rows=4096)
        _fill(replay, 20_000 if quick else 100_000)

        def sample_call():
            batches = [replay.sample(rng, 256, 0.99) for _ in range(K)]
            return jax.tree.map(lambda *xs: np.stack(xs), *batches)

        resident = jax.device_put(sample_call())
        state, _ = update_many(state, resident)  # compile
        jax.block_until_ready(state)
        prefetch = Prefetcher(sample_call, depth=2)
        bare, loop = [], []
        try:
            for _ in range(blocks):
                t0 = time.perf_counter()
                for _ in range(calls):
                    state, _ = update_many(state, resident)
                jax.block_until_ready(state)
                t1 = time.perf_counter()
                for _ in range(calls):
                    state, _ = update_many(state, prefetch.get())
                jax.block_until_ready(state)
                t2 = time.perf_counter()
                bare.append(calls * K / (t1 - t0))
                loop.append(calls * K / (t2 - t1))
        finally:
            prefetch.close()
            replay.close()
    bare_rate, loop_rate = statistics.median(bare), statistics.median(loop)
    return {"learner_loop_updates_per_s": round(loop_rate, 1), "bare_update_updates_per_s": round(bare_rate, 1),
            "learner_loop_ratio": round(loop_rate / bare_rate, 3), "updates_per_call": K, "batch_size": 256,
            "hidden_sizes": [256, 256]}
