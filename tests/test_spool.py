import pytest

from embodyrl.hal.wire.spool import Spool, SpoolFull


def frames(i, size=100):
    return [b"h%d" % i, bytes([i % 256]) * size]


def test_ack_forgets_in_order_and_ram_only_spool_works():
    s = Spool()
    for i in range(1, 6):
        s.push(i, 10, frames(i))
    assert s.rows == 50 and s.last_seq == 5
    s.ack(3)
    assert s.seqs() == [4, 5] and s.rows == 20
    assert s.frames(4) == frames(4)
    with pytest.raises(ValueError, match="not after"):
        s.push(5, 1, frames(5))


def test_spool_survives_a_restart_and_spills_past_its_ram_budget(tmp_path):
    s = Spool(tmp_path, ram_bytes=250)
    for i in range(1, 6):
        s.push(i, 7, frames(i))
    assert s.bytes_in_ram <= 250 < s.bytes_total
    assert s.frames(5) == frames(5)  # read back from disk
    s.ack(2)
    again = Spool(tmp_path, ram_bytes=250)  # the actor restarted
    assert again.seqs() == [3, 4, 5] and again.rows == 21
    assert [again.frames(i) for i in (3, 4, 5)] == [frames(i) for i in (3, 4, 5)]


def test_half_written_and_corrupt_batches_are_set_aside(tmp_path):
    s = Spool(tmp_path)
    s.push(1, 1, frames(1))
    s.push(2, 1, frames(2))
    (tmp_path / ".0000000000000003.tmp").write_bytes(b"partial")
    path = tmp_path / "0000000000000002.batch"
    path.write_bytes(path.read_bytes()[:-10])
    again = Spool(tmp_path)
    assert again.seqs() == [1]
    assert (tmp_path / "0000000000000002.corrupt").exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_full_spool_pauses_by_default():
    s = Spool(disk_bytes=500)
    for i in range(1, 5):
        s.push(i, 1, frames(i))
    with pytest.raises(SpoolFull, match="budget"):
        s.push(5, 1, frames(5))
    assert s.seqs() == [1, 2, 3, 4]  # nothing lost


def test_full_spool_can_drop_the_oldest_and_count_them(tmp_path):
    s = Spool(tmp_path, disk_bytes=500, on_full="drop_oldest")
    for i in range(1, 9):
        s.push(i, 3, frames(i))
    assert s.bytes_total <= 500
    assert s.dropped_batches == 4 and s.dropped_rows == 12
    assert s.seqs() == [5, 6, 7, 8]
    assert len(list(tmp_path.glob("*.batch"))) == 4


def _brute_rows_after(spool, seq):
    return sum(spool.rows_of(s) for s in spool.seqs() if s > seq)


def test_unsent_row_counts_match_a_walk_of_the_spool_through_drops_acks_and_a_restart(tmp_path):
    spool = Spool(tmp_path / "s", ram_bytes=300, disk_bytes=1000, on_full="drop_oldest")
    for seq in range(1, 31):
        spool.push(seq, seq % 7 + 1, frames(seq))  # 100-byte batches: the oldest get dropped
        if seq == 20:
            spool.ack(14)
        for after in (0, spool.first_seq - 1, spool.first_seq, seq // 2, seq - 1, seq, seq + 5):
            assert spool.rows_after(after) == _brute_rows_after(spool, after)
            assert list(spool.seqs_after(after)) == [s for s in spool.seqs() if s > after]
        assert spool.rows == _brute_rows_after(spool, -1)
    (tmp_path / "s" / f"{25:016d}.batch").write_bytes(b"torn")  # a gap after the restart
    again = Spool(tmp_path / "s")
    for after in (0, 22, 24, 25, 26, 30):
        assert again.rows_after(after) == _brute_rows_after(again, after)
        assert list(again.seqs_after(after)) == [s for s in again.seqs() if s > after]
