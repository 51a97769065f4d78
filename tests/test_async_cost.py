"""What the asynchronous path costs a learning run, kept bounded: the default pendulum trained over
the real path (a learner and an actor process over ZeroMQ) and in the synchronous loop (one
process, one step then its updates), 3 seeds each. The real path fails this test when its mean
evaluated return falls below the synchronous loop's by more than 20 % of (synchronous - random).

The synchronous loop acts every step with the newest weights and holds the update-to-data ratio
exactly; the real path's actor acts with weights some updates old and runs ahead of the updates by
up to ``learner.rate_tolerance`` steps (``policy_age`` and ``updates_behind`` in its metrics).
docs/benchmarks.md has the same comparison on HalfCheetah, part by part.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embodyrl.cli.launch import train
from embodyrl.config import default_config

pytestmark = pytest.mark.slow

SEEDS = (0, 1, 2)
TOLERANCE = 0.2


def _run(tmp_path, seed: int, synchronous: bool) -> dict:
    config = dataclasses.replace(default_config("pendulum"), seed=seed, synchronous=synchronous)
    return train(config, tmp_path / f"{'sync' if synchronous else 'async'}-s{seed}", quiet=True)


def test_the_real_path_learns_within_20_percent_of_the_synchronous_loop(tmp_path):
    runs = {(seed, sync): _run(tmp_path, seed, sync) for seed in SEEDS for sync in (True, False)}
    sync = np.mean([runs[s, True]["eval_return_mean"] for s in SEEDS])
    real = np.mean([runs[s, False]["eval_return_mean"] for s in SEEDS])
    random = np.mean([runs[s, True]["random_return_mean"] for s in SEEDS])
    per_seed = {f"{'sync' if k[1] else 'async'}-s{k[0]}": round(v["eval_return_mean"]) for k, v in runs.items()}
    assert sync > random + 500, f"the synchronous loop did not learn: {per_seed}, random {random:.0f}"
    assert real >= sync - TOLERANCE * (sync - random), (
        f"the real path's mean {real:.0f} is below the synchronous loop's {sync:.0f} by more than "
        f"{TOLERANCE:.0%} of (synchronous - random {random:.0f}): {per_seed}")
    for seed in SEEDS:  # what the comparison rests on: the real path's policies were some updates old
        assert runs[seed, False]["policy_age"]["mean"] > 0 and runs[seed, True]["policy_age"]["max"] == 0
