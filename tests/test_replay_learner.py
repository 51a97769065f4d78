"""The learner keeps its replay in run_dir/replay, acks only committed rows, and reopens it on restart."""

import dataclasses
import multiprocessing as mp
import time

import numpy as np

from embodyrl import envs
from embodyrl.cli.processes import actor_main
from embodyrl.config import LearnerConfig, TrainConfig, to_dict
from embodyrl.hal.layout import Layout
from embodyrl.learner import build_learner
from embodyrl.replay import PersistentReplay


def test_learner_commits_before_acking_and_a_restart_reopens_the_replay(tmp_path):
    learner_config = LearnerConfig(min_replay=64, replay_capacity=1024, replay_chunk_rows=128,
                                   updates_per_call=4, publish_every=8, rate_tolerance=256,
                                   credit_quantum=128, peer_timeout_s=20)
    config = TrainConfig(steps=300, learner=learner_config)
    config = dataclasses.replace(config, ddpg=dataclasses.replace(config.ddpg, batch_size=32))
    device, _ = envs.make("pendulum")
    specs = (device.observation_spec, device.action_spec)
    learner = build_learner(config, Layout.of("pendulum", *specs), tmp_path)
    acked = []
    original_ack = learner.server.ack

    def checked_ack(session, seq, credits=0):
        # acknowledged only once the replay's last commit holds it
        assert seq <= learner.data.replay.committed_seqs.get(session.actor_id, 0)
        acked.append(seq)
        original_ack(session, seq, credits)

    learner.server.ack = checked_ack
    actor = mp.get_context("spawn").Process(target=actor_main, args=(to_dict(config), learner.endpoint, 0))
    actor.start()
    try:
        deadline = time.monotonic() + 120
        counters = learner.run(should_stop=lambda: time.monotonic() > deadline)
    finally:
        actor.join(30)
        if actor.is_alive():
            actor.kill()
            actor.join(5)
    assert counters.env_steps >= 300 and counters.updates > 0 and acked, learner.server.stats
    replay = PersistentReplay(tmp_path / "replay")
    assert replay.size == counters.rows and replay.committed_seqs[0] == max(acked)
    batch = replay.sample(np.random.default_rng(0), 16, 0.98, n_step=3)
    assert batch["observation"]["orientation"].shape == (16, 2)
    replay.close()
    again = build_learner(config, Layout.of("pendulum", *specs), tmp_path)  # a restart on the same run directory
    try:
        assert again.data.replay.reopened and again.data.replay.size == counters.rows
        assert again.server.committed_seq(0) == max(acked)  # the transport dedupes from here
        assert again.data.limiter.inserts == counters.rows and again.data.trainable()
    finally:
        again.server.close()
        again.data.replay.close()
