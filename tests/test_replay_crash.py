"""kill -9 a writer at random instants, many times: every reopen is a consistent prefix of the stream.

One replay directory lives through all the kills: each writer process reopens
it, continues the deterministic stream (row g holds x = g) from the last
committed row, adds batches of random sizes and commits at random points,
until it is killed with SIGKILL. Most commits run in the background
(``maybe_commit``), so kills land mid-sync on the committer thread too (and, with
every batch written behind, with rows queued on the writer thread). After each kill the parent reopens the
buffer and checks it against the stream: the stored rows are exactly the
window of the ring's newest rows ending at the committed count, every link
between stored rows survived, and the committed sequence number matches.
"""

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from replay_helpers import ACT, EPISODE, OBS, all_starts, stored_in_order, stored_slots, stream_rows

from embodyrl.replay import PersistentReplay

CAPACITY, CHUNK = 1024, 64


def writer(directory: str, started: str, seed: int, write_behind_bytes: int | None) -> None:
    rng = np.random.default_rng(seed)
    replay = PersistentReplay(directory, OBS, ACT, capacity=CAPACITY, chunk_rows=CHUNK,
                              write_behind_bytes=write_behind_bytes)
    g = replay.rows_added
    open(started, "w").close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        n = int(rng.integers(1, 150))
        replay.add(stream_rows(g, n), seq=g + n)  # the seq of a batch: the stream position after it
        g += n
        if rng.random() < 0.1:
            replay.commit()
        else:
            replay.maybe_commit(float(rng.choice([0.0, 0.002])))  # background group commits


def check(directory) -> int:
    replay = PersistentReplay(directory)
    try:
        committed = replay.rows_added
        x = stored_in_order(replay)
        np.testing.assert_array_equal(x, np.arange(committed - len(x), committed, dtype=np.float32))
        assert replay.committed_seqs.get(0, 0) == committed
        rows = replay.store.rows[stored_slots(replay)]
        for name, column in stream_rows(committed - len(x), len(x)).arrays().items():
            np.testing.assert_array_equal(rows[name], column, err_msg=name)  # every field, every row
        rows = replay.store.rows
        starts, nxt = all_starts(replay)
        xs = rows["observation/x"][:, 0]
        assert (xs[nxt] == xs[starts] + 1).all()
        linked = set(xs[starts].astype(int).tolist())
        # every stored non-final row whose successor is stored is a valid start: no link was lost
        expected = {int(v) for v in x[:-1] if int(v) % EPISODE != EPISODE - 1}
        assert linked == expected
        return committed
    finally:
        replay.close(commit=False)


def run_kills(tmp_path, kills: int, write_behind_bytes: int | None = None) -> list[int]:
    ctx = mp.get_context("spawn")
    directory = str(tmp_path / "replay")
    rng = np.random.default_rng(0)
    committed = []
    for i in range(kills):
        started = str(tmp_path / f"started-{i}")
        proc = ctx.Process(target=writer, args=(directory, started, i, write_behind_bytes))
        proc.start()
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(started):
                assert proc.is_alive() and time.monotonic() < deadline, "writer did not start"
                time.sleep(0.005)
            time.sleep(float(rng.uniform(0.0, 0.15)))
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        committed.append(check(directory))
    return committed


def test_kill_minus_nine_at_random_points_leaves_a_consistent_prefix(tmp_path):
    committed = run_kills(tmp_path, 8)
    assert committed == sorted(committed) and committed[-1] > CAPACITY  # the ring wrapped


def test_kill_minus_nine_with_every_batch_written_behind(tmp_path):
    """The writer thread holds queued rows when the kill lands: commits cover only written rows."""
    committed = run_kills(tmp_path, 6, write_behind_bytes=0)
    assert committed == sorted(committed) and committed[-1] > 0


@pytest.mark.slow
def test_kill_minus_nine_many_times(tmp_path):
    committed = run_kills(tmp_path, 100)
    assert committed == sorted(committed)
