"""The synchronous loop (``embodyrl train --synchronous``) and what measures the asynchronous path
against it: the policy age of the rows a learner takes, the updates owed at the step budget, and the
policy snapshots a learning curve is evaluated from."""

import dataclasses
import json

import numpy as np
import pytest

from embodyrl.config import TrainConfig
from embodyrl.learner import synchronous
from embodyrl.learner.service import PolicyAge, age_distribution
from embodyrl.learner.snapshots import Snapshots, kept
from tests.cli_helpers import in_process


def test_policy_age_counts_updates_since_each_rows_weights_were_published():
    age = PolicyAge()
    age.published(1, 0)
    age.published(2, 32)
    age.published(3, 64)
    age.taken(np.array([3, 3, 2, 2, 2, 1]), updates=70)  # ages 6, 6, 38, 38, 38, 70
    age.taken(np.array([9]), updates=70)  # never published here: not aged
    assert age.interval() == {"policy_age": pytest.approx((2 * 6 + 3 * 38 + 70) / 6, abs=0.01),
                              "policy_age_max": 70}
    assert age.interval() == {"policy_age": None, "policy_age_max": None}  # nothing since
    assert age.distribution() == {"rows": 6, "mean": pytest.approx(32.67, abs=0.01), "p50": 38, "p90": 70,
                                  "p99": 70, "max": 70}
    for count in range(4, 4 + PolicyAge.KEEP):
        age.published(count, 100 + count)
    age.taken(np.array([1]), updates=10_000)  # forgotten: a long-spooled batch is not aged
    assert age.distribution()["rows"] == 6
    assert age_distribution({}) == {"rows": 0}


def test_snapshots_keep_each_multiple_once_as_training_reaches_it(tmp_path):
    saved = []

    def save(version, weights, directory):
        directory.mkdir(parents=True)
        saved.append((directory.name, version, weights["w"]))

    snaps = Snapshots(tmp_path, every=100, save=save)
    snaps.observe(64, 0, (1, 1), lambda: {"w": 0})  # before the first multiple: nothing
    snaps.observe(128, 5, (1, 2), lambda: {"w": 1})
    snaps.observe(192, 9, (1, 3), lambda: {"w": 2})  # the same multiple: kept once
    snaps.observe(320, 40, (1, 4), lambda: {"w": 3})  # 200 and 300 passed at once: the newest kept
    assert [(name, w) for name, _, w in saved] == [("000000100", 1), ("000000300", 3)]
    metas = [meta for meta, _ in kept(tmp_path)]
    assert [(m["env_steps"], m["env_steps_taken"], m["updates"]) for m in metas] == [(100, 128, 5), (300, 320, 40)]
    assert Snapshots(tmp_path, every=100, save=save).next == 400  # a resumed run goes on from the next
    assert Snapshots.of(TrainConfig(), tmp_path, save) is None  # eval_every 0: none


def _tiny(steps=600, **learner) -> TrainConfig:
    config = TrainConfig(task="pendulum", steps=steps, seed=3, eval_every=300, eval_episodes=1)
    return dataclasses.replace(
        config, sac=dataclasses.replace(config.sac, hidden_sizes=(16,), batch_size=32),
        learner=dataclasses.replace(config.learner, min_replay=200, log_every_s=0.2, **learner),
        actor=dataclasses.replace(config.actor, random_steps=200))


def test_the_synchronous_loop_acts_every_step_with_the_newest_weights(tmp_path, monkeypatch):
    """Each row the actor hands over was acted by the weights published after the previous row's
    updates (age 0), and the updates follow the rows exactly: ``updates_per_step`` per row past
    ``min_replay``, none ahead, none behind."""
    seen = []

    class Watched(synchronous.InlineLearner):
        def send_steps(self, device_id, steps):
            acted = ~steps.final & (steps.policy_incarnation == self.version.incarnation)
            seen.append((steps.policy_count[acted].tolist(), self.version.count, self.data.limiter.behind()))
            return super().send_steps(device_id, steps)

    monkeypatch.setattr(synchronous, "InlineLearner", Watched)
    synchronous.train_synchronous(_tiny(updates_per_step=2.0), tmp_path)
    acted = [(counts, newest) for counts, newest, _ in seen if counts]
    assert len(acted) > 300 and all(counts == [newest] for counts, newest in acted)
    assert all(behind == 0 for _, _, behind in seen)  # every update a row bought was taken before the next
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["updates"] == 2 * (last["replay_size"] - 200) and last["updates_behind"] == 0
    assert last["policy_age_distribution"]["max"] == 0 and last["policy_age_distribution"]["rows"] > 300
    assert [m["env_steps"] for m, _ in kept(tmp_path)] == [300, 600]
    assert (tmp_path / "policy" / "policy.json").exists()


def test_synchronous_refuses_what_it_cannot_drive(tmp_path):
    for args, said in ((["--algorithm", "ppo"], "on-policy"), (["--actors", "2"], "one actor")):
        done = in_process("train", "pendulum", "--synchronous", "--steps", "5000", "--run-dir",
                          str(tmp_path / args[1]), *args)
        assert done.returncode == 2 and "--synchronous" in done.stderr and said in done.stderr, done.stderr
        assert not (tmp_path / args[1] / "metrics.jsonl").exists()


def test_eval_every_must_not_be_negative():
    with pytest.raises(ValueError, match="eval_every"):
        TrainConfig(eval_every=-1)
