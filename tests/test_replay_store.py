"""The chunk ring's index arithmetic (property-based) and the store on real files: reopen, eviction, retention."""

import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import ACT, EPISODE, OBS, all_starts, stored_in_order, stream_rows

from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.replay import ChunkRing, PersistentReplay, ReplayFullError


@settings(max_examples=200, deadline=None)
@given(chunks=st.integers(2, 6), chunk_rows=st.integers(2, 9),
       batches=st.lists(st.tuples(st.integers(1, 20), st.booleans()), min_size=1, max_size=40))
def test_ring_is_fifo_over_unpinned_chunks_and_never_evicts_retained_ones(chunks, chunk_rows, batches):
    ring = ChunkRing(chunks, chunk_rows, retained=(1,))
    owner = np.full(chunks * chunk_rows, -1)  # slot -> global row number, our model of the ring
    written = 0
    for n, retained in batches:
        pinned_before = {int(c): int(ring.generation[c]) for c in np.flatnonzero(ring.pinned)}
        unpinned_live = {int(c) for c in np.flatnonzero((ring.generation >= 0) & ~ring.pinned)}
        try:
            segments, evict = ring.plan(n)
        except ReplayFullError:
            assert n > ring.room()
            continue
        # evictions: only unpinned chunks, oldest first, and only as many as needed
        assert set(evict) <= unpinned_live
        gens = [ring.generation[c] for c in evict]
        assert gens == sorted(gens)
        if evict:
            older_kept = [ring.generation[c] for c in unpinned_live - set(evict) if c != ring.current]
            assert not older_kept or min(older_kept) > max(gens)
        for c in evict:
            ring.evict(c)
            owner[c * chunk_rows:(c + 1) * chunk_rows] = -1
        sources = np.full(n, 1 if retained else 0)
        slots = ring.apply(segments, sources)
        assert len(np.unique(slots)) == n and slots.min() >= 0 and slots.max() < chunks * chunk_rows
        assert (owner[slots] == -1).all()  # never overwrites a live row
        owner[slots] = np.arange(written, written + n)
        written += n
        for c, g in pinned_before.items():  # retained chunks survive untouched
            assert ring.pinned[c] and ring.generation[c] == g
        assert ring.size == (owner >= 0).sum() and (ring.fill <= chunk_rows).all()
        stored = np.flatnonzero(owner >= 0)
        assert ring.row_valid(stored).all() and not ring.row_valid(np.flatnonzero(owner < 0)).any()
        # within a chunk, rows are consecutive in arrival order
        for c in np.flatnonzero(ring.fill):
            ids = owner[c * chunk_rows: c * chunk_rows + ring.fill[c]]
            assert (np.diff(ids) > 0).all()


def test_reopen_maps_the_same_rows_and_continues_the_stream(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=32)
    replay.add(stream_rows(0, 50), seq=1)
    replay.add(stream_rows(50, 17), seq=2)
    replay.commit()
    replay.add(stream_rows(67, 5), seq=3)  # never committed: lost, and its seq with it
    starts_before = all_starts(replay)
    replay.close(commit=False)
    again = PersistentReplay(tmp_path / "r")
    assert again.reopened and again.size == 67 and again.committed_seqs == {0: 2}
    np.testing.assert_array_equal(stored_in_order(again), np.arange(67))
    assert set(all_starts(again)[0]) <= set(starts_before[0])
    again.add(stream_rows(67, 40), seq=3)  # continues the episode that was open at the commit
    np.testing.assert_array_equal(stored_in_order(again), np.arange(107))
    starts, nxt = all_starts(again)
    x = again.store.rows["observation/x"][:, 0]
    assert (x[nxt] == x[starts] + 1).all()
    expected = {g for g in range(106) if g % EPISODE != EPISODE - 1}
    assert set(x[starts].astype(int).tolist()) == expected
    again.close()


def test_reopen_refuses_other_specs_and_names_missing_or_corrupt_files(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=64, chunk_rows=8)
    replay.add(stream_rows(0, 5), seq=1)
    replay.close()
    other = DictSpec.of(ArraySpec("x", (3,), np.float32))
    with pytest.raises(ValueError, match="differ from the ones asked for"):
        PersistentReplay(tmp_path / "r", other, ACT, capacity=64, chunk_rows=8)
    with pytest.raises(FileNotFoundError, match="no replay here"):
        PersistentReplay(tmp_path / "nothing")
    newest = max((tmp_path / "r").glob("index-*"), key=lambda p: p.stat().st_mtime_ns)
    older = next(p for p in (tmp_path / "r").glob("index-*") if p != newest)
    newest.write_bytes(newest.read_bytes()[:-3])  # a torn write: the older commit stands
    assert PersistentReplay(tmp_path / "r").committed_seqs == {}
    older.write_bytes(b"000000000000002\n{}garbage")
    with pytest.raises(ValueError, match="corrupt index"):
        PersistentReplay(tmp_path / "r")
    with pytest.raises(ValueError, match="multiple of chunk_rows"):
        PersistentReplay(tmp_path / "bad", OBS, ACT, capacity=60, chunk_rows=8)


def test_eviction_is_fifo_by_chunk_and_demonstrations_are_retained(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=64, chunk_rows=8)
    replay.add(stream_rows(10_000, 8, actor_id=1, source=1), seq=1)  # one chunk of demonstrations
    g = 0
    for _ in range(30):
        replay.add(stream_rows(g, 7), seq=g)
        g += 7
    x = stored_in_order(replay)
    demo = x >= 10_000
    assert demo.sum() == 8
    online = x[~demo]
    np.testing.assert_array_equal(online, np.arange(g - len(online), g))  # the newest, in order
    assert len(online) > 64 - 8 - 8
    replay.close()
    full = PersistentReplay(tmp_path / "f", OBS, ACT, capacity=16, chunk_rows=8)
    full.add(stream_rows(0, 8, source=1))
    full.add(stream_rows(8, 8, source=1))
    with pytest.raises(ReplayFullError, match="pinned by retained sources"):
        full.add(stream_rows(16, 1))
    full.close()


def test_files_are_mapped_not_copied(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=1 << 14, chunk_rows=1 << 10)
    replay.add(stream_rows(0, 1000))
    replay.close()
    again = PersistentReplay(tmp_path / "r")
    rows = again.store.rows
    assert not rows.flags.owndata and not rows.flags.writeable  # a read-only view of the mapping
    assert rows.base is not None and rows.nbytes == (tmp_path / "r" / "data.bin").stat().st_size
    again.close()


def test_background_commit_publishes_seqs_only_once_durable(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64)
    replay.add(stream_rows(0, 30), seq=1)
    advanced = replay.maybe_commit(0.0)  # starts it; its syncs may return before this call does
    assert replay.committed_seqs == ({0: 1} if advanced else {})  # published exactly when durable
    replay.add(stream_rows(30, 5), seq=2)  # added while the commit is in flight (or after): not in it
    deadline = time.monotonic() + 10
    while replay.committed_seqs != {0: 1}:
        assert not replay.maybe_commit(1e9) or replay.committed_seqs == {0: 1}
        assert time.monotonic() < deadline, "background commit did not finish"
        time.sleep(0.001)
    assert replay.commits == 1
    replay.close(commit=False)  # as a crash would: the later rows and seq 2 are lost together
    again = PersistentReplay(tmp_path / "r")
    assert again.size == 30 and again.committed_seqs == {0: 1}
    again.close()


def test_a_failed_background_commit_raises_at_the_next_call_and_acks_nothing(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64)
    replay.add(stream_rows(0, 10), seq=1)
    os.close(replay.store._index_fds[1])  # the first commit's index file: its write fails (EBADF)
    replay.maybe_commit(0.0)
    with pytest.raises(OSError):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            replay.maybe_commit(1e9)
            time.sleep(0.001)
    assert replay.committed_seqs == {}
    replay.store._index_fds[1] = os.open(tmp_path / "r" / "index-1", os.O_RDWR)
    replay.close(commit=False)


def test_a_full_ring_commits_the_next_eviction_ahead_so_add_does_not_wait(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64)
    replay.add(stream_rows(0, 256), seq=1)  # full: the next add overwrites the oldest chunk
    replay.commit()
    replay.add(stream_rows(256, 10), seq=2)  # evicts chunk 0, durable ahead in the last commit
    assert replay.store.commits == 1 and replay.size == 256 - 64 + 10  # no commit of its own
    assert stored_in_order(replay)[0] == 64
    replay.close(commit=False)  # a crash: the last commit already had chunk 0 evicted
    again = PersistentReplay(tmp_path / "r")
    np.testing.assert_array_equal(stored_in_order(again), np.arange(64, 256, dtype=np.float32))
    assert again.committed_seqs == {0: 1}
    again.add(stream_rows(256, 100), seq=2)  # continues where the commit ended
    np.testing.assert_array_equal(stored_in_order(again), np.arange(128, 356, dtype=np.float32))
    again.close()


def test_a_wrapping_ring_with_background_commits_never_waits_for_an_eviction(tmp_path, monkeypatch):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64)
    replay.add(stream_rows(0, 256), seq=1)
    replay.commit()
    waited = []
    original = replay.store.commit
    monkeypatch.setattr(replay.store, "commit", lambda: (waited.append(1), original()))
    g = 256
    for _ in range(40):  # 640 rows: ten chunk boundaries, each an eviction
        replay.add(stream_rows(g, 16), seq=g + 16)
        g += 16
        replay.maybe_commit(1e9)  # due only for a chunk's worth or a newly planned eviction
        deadline = time.monotonic() + 10
        while replay.store.committing:
            assert time.monotonic() < deadline, "background commit did not finish"
            time.sleep(0.001)
    assert waited == []
    np.testing.assert_array_equal(stored_in_order(replay), np.arange(g - replay.size, g, dtype=np.float32))
    replay.close(commit=False)
    again = PersistentReplay(tmp_path / "r")  # the last commit: every row up to its seq, evictions ahead
    x = stored_in_order(again)
    np.testing.assert_array_equal(x, np.arange(x[-1] + 1 - len(x), x[-1] + 1, dtype=np.float32))
    assert again.committed_seqs[0] == x[-1] + 1
    again.close()


def test_a_commit_retried_after_a_failed_one_never_writes_over_the_last_good_index(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64)
    replay.add(stream_rows(0, 10), seq=1)
    replay.commit()  # durable in index-1
    replay.add(stream_rows(10, 10), seq=2)
    os.close(replay.store._index_fds[0])  # the next index write fails (as on a full disk)
    with pytest.raises(OSError):
        replay.commit()
    assert replay.committed_seqs == {0: 1}
    replay.store._index_fds[0] = os.open(tmp_path / "r" / "index-0", os.O_RDWR)
    good = replay.store._index_fds[1]
    replay.store._index_fds[1] = -1  # writing over the last good commit would now fail loudly
    replay.commit()  # the retry goes to index-0 again, and keeps the failed commit's seq
    assert replay.committed_seqs == {0: 2}
    replay.store._index_fds[1] = good
    replay.close(commit=False)
    again = PersistentReplay(tmp_path / "r")
    assert again.committed_seqs == {0: 2} and again.size == 20
    again.close()
