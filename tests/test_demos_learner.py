"""Learning from demonstrations and interventions through a real learner (``build_learner``, a
real persistent replay): the sampled mix holds its fractions, a side short of its share is left
out (logged once), interventions count on the demonstration side and keep their proposed action,
demonstrations are loaded once across resumes and crashes, and mismatched ones are refused."""

import dataclasses
import json
import logging

import numpy as np
import pytest

from embodyrl.config import LearnerConfig, TrainConfig, build_config, default_config
from embodyrl.hal.demos import DemoWriter
from embodyrl.hal.layout import Layout
from embodyrl.hal.specs import ArraySpec, DictSpec, SpecError
from embodyrl.hal.steps import PolicyVersion, Source, StepRecorder
from embodyrl.learner import build_learner
from embodyrl.learner.replay_side import LEDGER

OBS = DictSpec.of(ArraySpec("x", (2,), np.float32))
ACT = ArraySpec("action", (1,), np.float32, -1, 1)
LAYOUT = Layout.of("toy", OBS, ACT)
V = PolicyVersion(5, 0)
BATCH, K = 32, 4


def _config(**learner) -> TrainConfig:
    lc = LearnerConfig(min_replay=64, replay_capacity=4096, replay_chunk_rows=256, updates_per_step=100.0,
                       updates_per_call=K, publish_every=10**6, prefetch_batches=0, checkpoint_every_s=3600,
                       log_every_s=3600, **learner)
    config = TrainConfig(steps=0, learner=lc)
    return dataclasses.replace(config, ddpg=dataclasses.replace(config.ddpg, hidden_sizes=(8,), batch_size=BATCH))


def _episode(recorder: StepRecorder, steps: int, *, marker: float = 0.0, source=Source.ONLINE,
             intervene_every: int = 0):
    """One episode of ``steps`` steps (x = [marker, t]); every ``intervene_every``-th step a person
    applied 0.5 where the policy proposed -0.5."""
    for t in range(steps):
        taken = source
        if intervene_every and t % intervene_every == 0:
            taken = Source.INTERVENTION
        applied, proposed = (0.5, -0.5) if taken == Source.INTERVENTION else (0.1, 0.1)
        recorder.add({"x": np.array([marker, t], np.float32)}, np.array([applied], np.float32),
                     np.array([proposed], np.float32), 1.0, False, t == steps - 1, V, source=taken)
    recorder.add_final({"x": np.array([marker, steps], np.float32)})
    return recorder.flush()


def _online(learner, episodes: int, *, steps: int = 99, actor_id: int = 0, seq: int = 0, **kw) -> int:
    recorder = StepRecorder(OBS, ACT, actor_id=actor_id, device_id=0)
    for _ in range(episodes):
        seq += 1
        learner.data.add(_episode(recorder, steps, **kw), seq, actor_id)
    learner.data.commit(final=True)
    return seq


def _demos(directory, files: int, steps: int = 19, *, first: int = 0, spec=OBS):
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + files):
        recorder = StepRecorder(spec, ACT, actor_id=0, device_id=0)
        writer = DemoWriter(directory / f"ep{i}.npz", spec, ACT)
        if spec is OBS:
            writer.add(_episode(recorder, steps, marker=1000.0 + i))
        else:
            for t in range(steps):
                recorder.add(spec.zeros(), np.zeros(1, np.float32), np.zeros(1, np.float32), 0.0, False,
                             t == steps - 1, V)
            recorder.add_final(spec.zeros())
            writer.add(recorder.flush())
        writer.close()
    return directory


def _close(learner) -> None:
    learner.server.close()
    learner.data.close(failed=False)


def _train(learner, calls: int) -> None:
    for _ in range(calls):
        assert learner.train()


def test_rlpd_defaults_to_half_demonstrations_the_others_to_uniform():
    assert build_config(default_config("pendulum"), None, [("algorithm", "rlpd")]).learner.mix == {
        "demonstration": 0.5, "online": 0.5}
    assert build_config(default_config("pendulum"), None, [("algorithm", "rlpd"), ("learner.mix", "{online: 1}")]
                        ).learner.mix == {"online": 1.0}  # set explicitly: taken whole
    for name in ("ddpg", "td3", "sac", "dqn"):
        assert build_config(default_config("pendulum"), None, [("algorithm", name)]).learner.mix is None
    with pytest.raises(ValueError, match="learner.mix.demo: not a source"):
        LearnerConfig(mix={"demo": 1.0})


def test_the_sampled_mix_matches_its_fractions_within_a_binomial_bound(tmp_path):
    fraction, calls = 0.25, 25
    config = _config(mix={"demonstration": fraction, "online": 1 - fraction},
                     demos=(str(_demos(tmp_path / "demos", 10)),))
    learner = build_learner(config, LAYOUT, tmp_path / "run")
    try:
        assert learner.data.replay.group_rows((Source.DEMONSTRATION,)) == 10 * 20
        _online(learner, 30)
        _train(learner, calls)
        record = learner.log()
    finally:
        _close(learner)
    drawn = calls * K * BATCH
    bound = 4 * np.sqrt(fraction * (1 - fraction) / drawn)  # 4 standard deviations of a binomial share
    assert abs(record["sampled_demo_fraction"] - fraction) <= bound, (record["sampled_demo_fraction"], bound)
    assert record["mix_fallback"] is False and record["sampled_intervention_fraction"] == 0.0
    written = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert written["sampled_demo_fraction"] == record["sampled_demo_fraction"]


def test_sampling_is_online_only_until_the_demonstration_side_holds_its_share_logged_once(tmp_path, caplog):
    learner = build_learner(_config(mix={"demonstration": 0.5, "online": 0.5}), LAYOUT, tmp_path)
    try:
        seq = _online(learner, 3)
        # one episode with 10 interventions: fewer than the 16 steps of a batch's demonstration share
        seq = _online(learner, 1, steps=20, intervene_every=2, seq=seq)
        with caplog.at_level(logging.INFO, logger="embodyrl.learner.replay_side"):
            _train(learner, 5)
            record = learner.log()
            assert record["mix_fallback"] is True and record["sampled_demo_fraction"] == 0.0
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1, warnings
            assert "DEMONSTRATION/INTERVENTION holds 10 of the 16 steps" in warnings[0]
            assert "sampling ONLINE only" in warnings[0]
            _online(learner, 1, steps=40, intervene_every=2, seq=seq)  # now 30 intervention steps
            _train(learner, 5)
            record = learner.log()
        assert record["mix_fallback"] is False and record["sampled_demo_fraction"] == 0.5
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
        assert any("every side holds its share" in r.getMessage() for r in caplog.records)
    finally:
        _close(learner)


def test_intervention_rows_are_drawn_on_the_demonstration_side_and_keep_their_proposed_action(tmp_path):
    learner = build_learner(_config(mix={"demonstration": 0.5, "online": 0.5}), LAYOUT, tmp_path)
    try:
        _online(learner, 4, intervene_every=3)  # 4 x 33 intervention steps, no demonstration files
        _train(learner, 4)
        sources = learner.data.last_batch_keys["source"]
        record = learner.log()
        rows = learner.data.replay.store.rows[:learner.data.replay.size]
    finally:
        _close(learner)
    assert record["sampled_intervention_fraction"] == record["sampled_demo_fraction"] == 0.5
    assert ((sources == Source.INTERVENTION).sum(axis=1) == BATCH // 2).all()  # every batch: half
    taken = rows[rows["source"] == Source.INTERVENTION]
    assert len(taken) == 4 * 33
    np.testing.assert_array_equal(taken["action"][:, 0], 0.5)  # the person's action trains...
    np.testing.assert_array_equal(taken["proposed_action"][:, 0], -0.5)  # ...the policy's is kept


def test_demonstrations_are_neither_lost_nor_duplicated_across_resumes(tmp_path):
    demos = _demos(tmp_path / "demos", 3)
    run = tmp_path / "run"
    config = _config(demos=(str(demos),))
    learner = build_learner(config, LAYOUT, run)
    _online(learner, 2)
    _close(learner)

    _demos(demos, 1, first=3)  # one more recording before the resume
    again = build_learner(config, LAYOUT, run)
    try:
        replay = again.data.replay
        assert replay.group_rows((Source.DEMONSTRATION,)) == 4 * 20
        assert replay.size == 4 * 20 + 2 * 100
        markers = replay.store.rows["observation/x"][:replay.size, 0]
        assert sorted(set(markers[markers >= 1000].tolist())) == [1000.0, 1001.0, 1002.0, 1003.0]
        assert np.bincount((markers[markers >= 1000] - 1000).astype(int)).tolist() == [20] * 4
    finally:
        _close(again)
    ledger = json.loads((run / "replay" / LEDGER).read_text())["files"]
    assert [e["name"] for e in ledger] == ["ep0.npz", "ep1.npz", "ep2.npz", "ep3.npz"]
    assert all(e["steps"] == 20 and len(e["sha256"]) == 64 for e in ledger)


def test_a_crash_before_the_demonstrations_commit_loads_them_again_once(tmp_path):
    demos = _demos(tmp_path / "demos", 2)
    config = _config(demos=(str(demos),))
    learner = build_learner(_config(), LAYOUT, tmp_path)
    replay = learner.data.replay
    replay.commit = lambda: None  # the rows are added, the ledger written, then the process dies
    learner.data.load_demonstrations(config.learner.demos, [("toy", OBS, ACT)])
    learner.server.close()
    learner.data.close(failed=True)  # as a crash: nothing after the last commit survives
    assert len(json.loads((tmp_path / "replay" / LEDGER).read_text())["files"]) == 2

    again = build_learner(config, LAYOUT, tmp_path)
    try:
        assert again.data.replay.group_rows((Source.DEMONSTRATION,)) == 2 * 20
    finally:
        _close(again)


def test_demonstrations_with_other_specs_are_refused_naming_the_field(tmp_path):
    wide = DictSpec.of(ArraySpec("x", (3,), np.float32))
    _demos(tmp_path / "demos", 1)
    _demos(tmp_path / "demos", 1, first=3, spec=wide)
    with pytest.raises(SpecError, match=r"demos/ep3.npz: observation 'x': shape \(3,\) but the task's is \(2,\)"):
        build_learner(_config(demos=(str(tmp_path / "demos"),)), LAYOUT, tmp_path / "run")
    assert not (tmp_path / "run" / "replay" / LEDGER).exists()  # refused before any was loaded
    other = DictSpec.of(ArraySpec("y", (2,), np.float32))
    _demos(tmp_path / "other", 1, spec=other)
    with pytest.raises(SpecError, match="observation 'x': the task has it, the recording does not"):
        build_learner(_config(demos=(str(tmp_path / "other"),)), LAYOUT, tmp_path / "run2")
    with pytest.raises(ValueError, match="learner.demos: .* holds no demonstration files"):
        (tmp_path / "empty").mkdir()
        build_learner(_config(demos=(str(tmp_path / "empty"),)), LAYOUT, tmp_path / "run3")
