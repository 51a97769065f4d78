"""A failed row write sticks: once the ring counts rows that never reached the data file, no
commit, read or close may treat them as stored. Real files; failures injected into the write
call only (``RowWriter._pwrite``), timeouts by holding the writer thread."""

import os
import threading

import numpy as np
import pytest
from replay_helpers import ACT, OBS, all_starts, stored_in_order, stream_rows

from embodyrl.replay import PersistentReplay
from embodyrl.replay import writer as W
from embodyrl.replay.writer import RowsLost


def _fail_writes(monkeypatch, thread_name: str | None = None):
    """Every row write (on ``thread_name``, or any thread) raises EIO until undone."""
    real = W.RowWriter._pwrite

    def failing(writer, *args):
        if thread_name is None or threading.current_thread().name == thread_name:
            raise OSError(5, "injected EIO")
        return real(writer, *args)

    monkeypatch.setattr(W.RowWriter, "_pwrite", failing)
    return lambda: monkeypatch.setattr(W.RowWriter, "_pwrite", real)


def _assert_refuses_everything(replay):
    for call in (replay.commit, replay.wait_for_writes, lambda: replay.store.rows,
                 lambda: replay.add(stream_rows(50, 5), seq=9), lambda: replay.maybe_commit(0.0)):
        with pytest.raises(RowsLost, match="injected EIO|no progress"):
            call()


def _reopen_holds_only_the_first_commit(path):
    again = PersistentReplay(path)
    try:
        np.testing.assert_array_equal(stored_in_order(again), np.arange(5, dtype=np.float32))
        assert again.committed_seqs == {0: 1} and again.rows_added == 5
        starts, _ = all_starts(again)
        assert starts.max() < 5  # no zero row is a valid transition start
    finally:
        again.close()


def test_a_failed_inline_write_fails_every_later_commit_and_read(tmp_path, monkeypatch):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64)  # inline writes
    replay.add(stream_rows(0, 5), seq=1)
    replay.commit()
    undo = _fail_writes(monkeypatch)
    with pytest.raises(OSError, match="injected EIO"):
        replay.add(stream_rows(5, 5), seq=2)
    undo()  # writes work again: the lost rows stay lost
    _assert_refuses_everything(replay)
    with pytest.raises(RowsLost):
        replay.close()  # what Learner.run's finally did: commit, which made the junk durable
    _reopen_holds_only_the_first_commit(tmp_path / "r")


def test_an_add_whose_write_queue_timed_out_fails_every_later_commit(tmp_path, monkeypatch):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64, write_behind_bytes=0)
    replay.add(stream_rows(0, 5), seq=1)
    replay.commit()
    thread = replay.store._writer._thread
    thread.deadline_s = 0.3
    gate = threading.Event()
    real = W.RowWriter._pwrite

    def held(writer, *args):
        if threading.current_thread().name == "replay-write":
            gate.wait(10)
        return real(writer, *args)

    monkeypatch.setattr(W.RowWriter, "_pwrite", held)
    with pytest.raises(TimeoutError):
        for i in range(1, 10):  # own streams (no link patches); the queue fills, then times out
            replay.add(stream_rows(i, 1, actor_id=i), seq=1)
    gate.set()
    monkeypatch.setattr(W.RowWriter, "_pwrite", real)
    for call in (replay.commit, lambda: replay.store.rows):
        with pytest.raises(RowsLost, match="no progress"):
            call()
    assert replay.committed_seqs == {0: 1}
    replay.close(commit=False)
    again = PersistentReplay(tmp_path / "r")
    assert again.committed_seqs == {0: 1} and again.rows_added == 5
    again.close()


def test_a_failed_close_keeps_the_error_and_closes_the_files(tmp_path, monkeypatch):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64, write_behind_bytes=0)
    replay.add(stream_rows(0, 5), seq=1)
    replay.commit()
    undo = _fail_writes(monkeypatch, "replay-write")
    replay.add(stream_rows(5, 5), seq=2)
    with pytest.raises(OSError, match="write failed"):
        replay.wait_for_writes()
    undo()
    fd = replay.store._fd
    with pytest.raises(RowsLost, match="injected EIO"):
        replay.close()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed, not half open
    for call in (replay.commit, lambda: replay.store.rows, lambda: replay.add(stream_rows(10, 5), seq=3)):
        with pytest.raises(ValueError, match="replay is closed"):
            call()
    assert replay.store._writer.failure is not None  # close did not forget it
    with pytest.raises(RowsLost):
        replay.store._writer.check()
    _reopen_holds_only_the_first_commit(tmp_path / "r")


def test_close_leaves_the_file_open_while_the_writer_thread_still_writes(tmp_path, monkeypatch):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64, write_behind_bytes=0)
    replay.add(stream_rows(0, 5), seq=1)
    replay.commit()
    gate, started = threading.Event(), threading.Event()
    real = W.RowWriter._pwrite

    def held(writer, *args):
        if threading.current_thread().name == "replay-write":
            started.set()
            gate.wait(10)
        return real(writer, *args)

    monkeypatch.setattr(W.RowWriter, "_pwrite", held)
    replay.add(stream_rows(5, 5), seq=2)
    assert started.wait(10)
    replay.store._writer._thread.deadline_s = 0.2
    with pytest.raises(TimeoutError, match="still runs"):
        replay.close(commit=False)
    os.fstat(replay.store._fd)  # still open: the pending pwrite must not hit a closed or reused fd
    with pytest.raises(RowsLost):
        replay.commit()  # whatever it writes, no commit counts on it now
    gate.set()
    replay.close(commit=False)  # the thread finishes: now the files close
    assert replay.store._fd == -1
    _reopen_holds_only_the_first_commit(tmp_path / "r")


def test_a_failed_background_commit_keeps_its_seqs_pending_for_the_retry(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64)
    replay.add(stream_rows(0, 10), seq=1)
    good = replay.store._index_fds[1]
    replay.store._index_fds[1] = -1  # the first commit's index write fails (EBADF), not a row write
    replay.store.commit_in_background()
    with pytest.raises(OSError):
        replay.store.settle()
    assert replay.committed_seqs == {} and replay.store._pending_seqs == {0: 1}
    replay.store._index_fds[1] = good
    replay.commit()  # not sticky: a commit may be retried; its seq was re-queued on this thread
    assert replay.committed_seqs == {0: 1}
    replay.close()
