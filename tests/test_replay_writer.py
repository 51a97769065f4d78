"""Write-behind: rows land in order, commits wait for the writes they count, the queue is bounded,
and a failed write is never acknowledged. Every batch goes behind here (``write_behind_bytes=0``)."""

import threading
import time

import numpy as np
import pytest
from replay_helpers import ACT, EPISODE, OBS, all_starts, stored_in_order, stream_rows

from embodyrl.replay import PersistentReplay
from embodyrl.replay import writer as W
from embodyrl.replay.layout import DATA_FILE


class GatedWrites:
    """Row writes (not link patches) of the writer thread wait for ``open`` (bounded)."""

    def __init__(self, monkeypatch):
        self.gate = threading.Event()
        self.started = threading.Event()
        real = W.RowWriter._pwrite

        def gated(writer, data, position):
            if threading.current_thread().name == "replay-write" and memoryview(data).nbytes > 16:
                self.started.set()
                assert self.gate.wait(20), "test never opened the gate"
            real(writer, data, position)

        monkeypatch.setattr(W.RowWriter, "_pwrite", gated)


def test_every_row_and_link_lands_when_all_writes_go_behind(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=512, chunk_rows=64, write_behind_bytes=0)
    g = 0
    for n in (5, 64, 1, 70, 33, 200, 17, 100):  # across chunk boundaries and a ring wrap
        replay.add(stream_rows(g, n), seq=g + n)
        g += n
    assert replay.store._writer._thread is not None and replay.store._writer.ticket() >= 8
    x = stored_in_order(replay)  # reading rows waits for the queued writes
    np.testing.assert_array_equal(x, np.arange(g - len(x), g, dtype=np.float32))
    starts, nxt = all_starts(replay)
    xs = replay.store.rows["observation/x"][:, 0]
    assert (xs[nxt] == xs[starts] + 1).all()
    expected = {int(v) for v in x[:-1] if int(v) % EPISODE != EPISODE - 1}
    assert set(xs[starts].astype(int).tolist()) == expected  # every link across batches was patched
    replay.close()
    again = PersistentReplay(tmp_path / "r")  # the newest rows, less the chunks planned for eviction
    y = stored_in_order(again)
    assert again.rows_added == g and len(y) >= len(x) - 2 * 64
    np.testing.assert_array_equal(y, x[len(x) - len(y):])
    again.close()


def test_a_link_patch_waits_behind_the_row_write_it_patches(tmp_path, monkeypatch):
    gates = GatedWrites(monkeypatch)
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64, write_behind_bytes=0)
    replay.add(stream_rows(0, 4), seq=1)
    assert gates.started.wait(10)  # the first batch's write is held
    replay.add(stream_rows(4, 3), seq=2)  # patches row 3 -> row 4: must not land before row 3
    gates.gate.set()
    starts, nxt = all_starts(replay)
    assert 3 in starts.tolist() and int(nxt[starts.tolist().index(3)]) == 4
    replay.close()


def test_a_commit_waits_for_the_writes_it_counts_before_its_seqs_are_acknowledged(tmp_path, monkeypatch):
    gates = GatedWrites(monkeypatch)
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64, write_behind_bytes=0)
    replay.add(stream_rows(0, 10), seq=7)
    assert gates.started.wait(10)
    replay.maybe_commit(0.0)  # a background commit snapshots now; its rows are still queued
    time.sleep(0.3)
    assert not replay.maybe_commit(1e9) and replay.committed_seqs == {}  # nothing acked yet
    gates.gate.set()
    deadline = time.monotonic() + 10
    while replay.committed_seqs == {} and time.monotonic() < deadline:
        replay.maybe_commit(1e9)
        time.sleep(0.005)
    assert replay.committed_seqs == {0: 7}
    # the rows were in the file before the commit said so: read them back without the mapping
    with open(tmp_path / "r" / DATA_FILE, "rb") as f:
        raw = np.frombuffer(f.read(10 * replay.store.row_bytes), replay.store.dtype)
    np.testing.assert_array_equal(raw["observation/x"][:, 0], np.arange(10, dtype=np.float32))
    replay.close()


def test_the_queue_is_bounded_add_waits_for_a_free_slot(tmp_path, monkeypatch):
    gates = GatedWrites(monkeypatch)
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64, write_behind_bytes=0)
    depth = replay.store._writer._depth
    for i in range(depth):  # one being written (held) and depth - 1 waiting: the queue is full
        replay.add(stream_rows(i, 1, actor_id=i), seq=1)  # streams of their own: no link patches
    assert gates.started.wait(10)
    done = threading.Event()
    extra = threading.Thread(target=lambda: (replay.add(stream_rows(depth, 1, actor_id=depth), seq=1), done.set()))
    extra.start()
    assert not done.wait(0.3)  # blocked: no unbounded queue
    gates.gate.set()
    assert done.wait(10)
    extra.join(10)
    np.testing.assert_array_equal(stored_in_order(replay), np.arange(depth + 1, dtype=np.float32))
    replay.close()


def test_a_failed_write_fails_every_later_commit_and_acknowledges_nothing(tmp_path, monkeypatch):
    real = W.RowWriter._pwrite

    def failing(writer, data, position):
        if threading.current_thread().name == "replay-write":
            raise OSError(5, "injected I/O error")
        real(writer, data, position)

    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64, write_behind_bytes=0)
    replay.add(stream_rows(0, 5), seq=1)
    replay.commit()
    assert replay.committed_seqs == {0: 1}
    monkeypatch.setattr(W.RowWriter, "_pwrite", failing)
    replay.add(stream_rows(5, 5), seq=2)
    with pytest.raises(OSError, match="write failed"):
        replay.commit()
    assert replay.committed_seqs == {0: 1}
    monkeypatch.setattr(W.RowWriter, "_pwrite", real)  # even if writes work again: the lost one stays lost
    with pytest.raises(OSError, match="write failed"):
        replay.add(stream_rows(10, 5), seq=3)
        replay.commit()
    assert replay.committed_seqs == {0: 1}
    replay.close(commit=False)
    again = PersistentReplay(tmp_path / "r")  # the last good commit stands
    assert again.committed_seqs == {0: 1} and again.rows_added == 5
    again.close()


def test_writes_stay_on_the_callers_thread_by_default_and_under_the_threshold(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=256, chunk_rows=64)  # default: off
    replay.add(stream_rows(0, 60), seq=1)
    assert replay.store._writer._thread is None
    replay.close()
    row = PersistentReplay(tmp_path / "t", OBS, ACT, capacity=256, chunk_rows=64).store.row_bytes
    some = PersistentReplay(tmp_path / "s", OBS, ACT, capacity=256, chunk_rows=64, write_behind_bytes=50 * row)
    some.add(stream_rows(0, 49), seq=1)
    assert some.store._writer._thread is None
    some.add(stream_rows(49, 50), seq=2)
    assert some.store._writer._thread is not None
    some.close()


def _image_steps(first: int, count: int, camera_dtype=np.uint8):
    """``stream_rows`` with an 84x84x3 camera whose every byte depends on the row."""
    from embodyrl.hal.steps import Steps

    base = stream_rows(first, count)
    g = np.arange(first, first + count)
    camera = ((g[:, None] * 7 + np.arange(84 * 84 * 3)[None]) % 251).astype(camera_dtype).reshape(count, 84, 84, 3)
    return Steps(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, "observation": {"camera": camera}})


@pytest.mark.parametrize("behind", [None, 0])
def test_image_columns_are_written_straight_from_the_received_arrays_bit_exactly(tmp_path, behind):
    from embodyrl.hal.specs import ArraySpec, DictSpec
    from embodyrl.replay.layout import direct_fields

    obs = DictSpec.of(ArraySpec("camera", (84, 84, 3), np.uint8))
    replay = PersistentReplay(tmp_path / "r", obs, ACT, capacity=192, chunk_rows=64, write_behind_bytes=behind)
    assert direct_fields(replay.store.dtype) == ("observation/camera",)
    g = 0
    for n in (3, 70, 64, 41, 1):  # chunk boundaries (two pwritev calls) and a wrap
        replay.add(_image_steps(g, n), seq=g + n)
        g += n
    replay.commit()
    ring = replay.store.ring
    slots = np.concatenate([np.arange(c * 64, c * 64 + ring.fill[c]) for c in np.argsort(ring.generation)
                            if ring.generation[c] >= 0])
    rows = replay.store.rows[slots]
    expected = _image_steps(g - len(slots), len(slots))
    for name, column in expected.arrays().items():
        np.testing.assert_array_equal(rows[name], column, err_msg=name)
    starts, nxt = all_starts(replay)
    assert len(starts) > 0 and (replay.store.rows["step_index"][nxt] == (replay.store.rows["step_index"][starts] + 1)).all()
    replay.close()
