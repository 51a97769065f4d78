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
