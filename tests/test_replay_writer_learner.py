"""The real learner with image batches (written behind its ingest thread): every acknowledged row is
stored bit-exactly and the acks never run ahead of the durable commit."""

import multiprocessing as mp
import time

import numpy as np

from embodyrl.algos.ddpg import DDPGConfig
from embodyrl.algos.encoders import EncoderConfig
from embodyrl.bench import transport as T
from embodyrl.config import LearnerConfig, TrainConfig
from embodyrl.hal.layout import Layout
from embodyrl.learner import build_learner
from embodyrl.replay import PersistentReplay

CAMERA_DDPG = DDPGConfig(hidden_sizes=(16,), encoder=EncoderConfig(image_fields=("auto",), channels=(4,), strides=(2,)))
"""The camera read by a small encoder (a camera is never flattened into the MLP); these tests never train."""


def test_image_batches_through_the_learner_are_acked_after_commit_and_stored_bit_exact(tmp_path):
    batches, rows = 12, 128  # 2.7 MB each: over the learner's 256 KiB write-behind threshold
    lc = LearnerConfig(min_replay=10**9, replay_capacity=2 * batches * rows, replay_chunk_rows=512,
                       credit_quantum=4 * rows, rate_tolerance=8 * rows, log_every_s=1e9)
    learner = build_learner(TrainConfig(task="bench", steps=batches * rows, learner=lc, ddpg=CAMERA_DDPG), Layout.of("bench", T.IMAGE_SPEC, T.IMAGE_ACTION),
                      tmp_path)
    assert learner.data.replay.store._writer._behind_bytes == 256 << 10
    learner.server.know_incarnations((T.EARLIER_INCARNATION,))  # the bench's senders act under it
    acked = []
    original_ack = learner.server.ack

    def checked_ack(session, seq, credits=0):
        assert seq <= learner.data.replay.committed_seqs.get(session.actor_id, 0)  # durable first
        acked.append(seq)
        original_ack(session, seq, credits)

    learner.server.ack = checked_ack
    writer, behind = learner.data.replay.store._writer, []
    original_write = writer.write

    def noted_write(writes, staging):
        behind.append(writer._behind)
        original_write(writes, staging)

    writer.write = noted_write
    sender = mp.get_context("spawn").Process(target=T._link_sender, args=(
        learner.endpoint, batches, T.IMAGE_SPEC.to_msg(), T.IMAGE_ACTION.to_msg(), rows, 0))
    sender.start()
    try:
        deadline = time.monotonic() + 120
        counters = learner.run(should_stop=lambda: time.monotonic() > deadline)
    finally:
        sender.join(30)
        if sender.is_alive():
            sender.kill()
            sender.join(5)
    assert counters.rows == batches * rows and max(acked) == batches
    assert behind == [True] * batches  # every batch went behind the ingest thread
    replay = PersistentReplay(tmp_path / "replay")
    try:
        assert replay.size == batches * rows and replay.committed_seqs[0] == batches
        sent = T._batch(T.IMAGE_SPEC, T.IMAGE_ACTION, rows, 0, 0).arrays()
        stored = replay.store.rows[:batches * rows]
        for name, column in sent.items():
            if name not in ("step_index", "episode_id"):  # the same batch again: only these differ
                np.testing.assert_array_equal(stored[name], np.concatenate([column] * batches), err_msg=name)
    finally:
        replay.close()


def test_a_failed_row_write_still_saves_the_model_closes_everything_and_raises(tmp_path, monkeypatch):
    import threading

    import pytest

    from embodyrl.learner.checkpoint import Checkpointer
    from embodyrl.replay import writer as W

    rows = 128  # 2.7 MB: written behind the ingest thread
    lc = LearnerConfig(min_replay=10**9, replay_capacity=4 * rows, replay_chunk_rows=512, log_every_s=1e9)
    learner = build_learner(TrainConfig(task="bench", steps=10**9, learner=lc, ddpg=CAMERA_DDPG), Layout.of("bench", T.IMAGE_SPEC, T.IMAGE_ACTION), tmp_path)
    batch = T._batch(T.IMAGE_SPEC, T.IMAGE_ACTION, rows, 0, 0)
    learner.data.replay.add(batch, seq=1)
    learner.data.replay.commit()
    real = W.RowWriter._pwrite

    def failing(writer, *args):
        if threading.current_thread().name == "replay-write":
            raise OSError(5, "injected EIO")
        return real(writer, *args)

    monkeypatch.setattr(W.RowWriter, "_pwrite", failing)
    learner.data.replay.add(T._batch(T.IMAGE_SPEC, T.IMAGE_ACTION, rows, 0, 1), seq=2)  # its write fails behind
    with pytest.raises(W.RowsLost, match="injected EIO"):
        learner.run(should_stop=lambda: True)  # the finally's commit fails: reported, not swallowed
    monkeypatch.setattr(W.RowWriter, "_pwrite", real)
    assert Checkpointer(tmp_path / "checkpoints").latest_step() is not None  # the model was saved
    assert (tmp_path / "policy").exists()
    assert learner.server._socket.closed and learner.data.replay.store._fd == -1
    assert learner.data.replay.store._writer._thread is None  # no writer thread left behind
    replay = PersistentReplay(tmp_path / "replay")  # the last good commit stands, nothing after it
    try:
        assert replay.committed_seqs == {0: 1} and replay.size == rows
        np.testing.assert_array_equal(replay.store.rows["observation/camera"][:rows], batch.observation["camera"])
    finally:
        replay.close()
