"""Chunks-then-rows sampling: only pooled chunks per batch, yet every stored row in the long run."""

import numpy as np
from replay_helpers import ACT, OBS, stream_rows

from embodyrl.replay import PersistentReplay
from embodyrl.replay.staged import StagedSampler


def test_staged_batches_come_from_the_pool_and_cover_the_buffer_uniformly(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=64 * 32, chunk_rows=64,
                              ram_budget_bytes=8 * 64 * 64)
    for g in range(0, 64 * 32, 256):
        replay.add(stream_rows(g, 256))
    staged = StagedSampler(replay, pool_chunks=4, turnover_every=1, seed=1)
    rng = np.random.default_rng(0)
    counts = np.zeros(32)
    for _ in range(12000):  # enough pool turnovers that residence times average out
        batch = staged.sample(rng, 64, 0.9)
        chunks = (batch["observation"]["x"][:, 0] // 64).astype(int)
        pooled = set(staged.pool)
        assert set(chunks.tolist()) <= pooled and len(pooled) <= 4  # rows come from the pool only
        np.testing.assert_array_equal(batch["next_observation"]["x"][:, 0], batch["observation"]["x"][:, 0] + 1)
        np.add.at(counts, chunks, 1)
        # each requested chunk joins before the next batch: the loader thread's share of the GIL
        # (hence the machine's load) would otherwise set how many turnovers 12,000 batches see
        staged.warm_up(rng, timeout_s=10)
    share = counts / counts.sum()
    tv = 0.5 * np.abs(share - 1 / 32).sum()
    print(f"chunk TV from uniform {tv:.3f}, min {share.min() * 32:.2f}, max {share.max() * 32:.2f}")
    # every chunk drawn, none far more than its share (residence times are random, so not exact)
    assert share.min() > 0.35 / 32 and share.max() < 2 / 32 and tv < 0.15
    assert replay.cache.borrowed.sum() == len(staged.pool)
    staged.warm_up(rng, timeout_s=10)
    assert len(staged.pool) == 4 and not staged.loading
    staged.close()
    replay.close()
