"""The streaming path of the coupling link: rows gathered straight into one batch per ``send_every``
exchanges reach a real learner server exactly as the model gave them, and the link's clocks."""

import time
from dataclasses import replace

import numpy as np
import pytest

from embodyrl.coupling.testing import ServedCoupling, random_export
from embodyrl.hal import runtime
from embodyrl.hal.coupling.batch import ColumnBatch
from embodyrl.hal.coupling.link import CouplingError, CouplingLink, io_threads_cpu_s
from embodyrl.hal.steps import PolicyVersion, Steps
from tests.test_coupling_mpi import CFG


def _exchanges(n_list, seed=0):
    rng = np.random.default_rng(seed)
    for n in n_list:
        state = rng.normal(size=(n, CFG.levels, CFG.features))
        if n % 2:
            state = np.asfortranarray(state.astype(np.float32))  # the model's own order and dtype
        yield state, {"context": rng.normal(size=(n, CFG.context)), "target": rng.normal(size=(n, CFG.levels))}


def test_streamed_rows_are_the_models_columns_with_their_rewards(tmp_path):
    served = ServedCoupling(CFG)
    given = []
    try:
        path = served.export(tmp_path / "policy")  # the learner's own: rows acted under it are admitted
        link = CouplingLink(replace(CFG, learner=served.endpoint, send_every=3, stream_fraction=0.5), rank=2,
                            policy=runtime.load(path), seed=0)
        for state, info in _exchanges([8, 8, 8, 8, 21, 21, 9]):  # the column count changes inside a batch
            correction = link.exchange(state, info)
            given.append((state, info, correction))
        link.close(flush_s=5.0)
        served.wait(lambda c: c.steps_by_rank.get(2, 0) >= link.stats.steps_sent, timeout_s=5)
    finally:
        served.close()
    steps = [t.steps for t in served.taken]
    assert sum(len(s) for s in steps) == link.stats.steps_sent == 4 * 4 + 2 * 10 + 4  # half of 8, 21, 9
    incarnation = runtime.load(path).version.incarnation
    assert incarnation == served.version.incarnation != 0  # the policy it acted under is the learner's
    rows = {(int(s.episode_id[i]), int(s.step_index[i])): (s, i) for s in steps for i in range(len(s))}
    episodes = {}  # each column keeps its episode id while the column count stays; match rows by content
    for k, (state, info, correction) in enumerate(given):
        mine = [(s, i) for (e, t), (s, i) in rows.items() if t == k]
        assert len(mine) == max(1, round(0.5 * len(state)))
        for s, i in mine:
            same = (state.astype(np.float32) == s.observation["profile"][i]).all(axis=(1, 2))
            assert same.sum() == 1  # the row is exactly one of this exchange's columns
            c = int(np.argmax(same))
            np.testing.assert_array_equal(s.observation["context"][i], info["context"][c].astype(np.float32))
            np.testing.assert_allclose(s.action[i], correction[c], rtol=1e-6)
            want = -np.mean(((correction[c].astype(np.float32) - info["target"][c]) / CFG.max_correction) ** 2)
            assert s.reward[i] == pytest.approx(want, rel=1e-5)
            assert s.terminated[i] and not s.truncated[i] and not s.final[i] and s.source[i] == 0
            assert s.actor_id[i] == s.device_id[i] == 2 and s.policy_incarnation[i] == incarnation
            assert s.proposed_action is s.action  # not on the wire: the learner rebuilt it, no copy
            episodes.setdefault((len(state), c), int(s.episode_id[i]))
            assert episodes[(len(state), c)] == int(s.episode_id[i])


def test_a_taken_batch_is_never_written_again():
    batch = ColumnBatch(levels=4, features=2, context=1, rank=5, max_correction=2.0)
    rng = np.random.default_rng(1)
    profile, context = rng.normal(size=(6, 4, 2)).astype(np.float32), rng.normal(size=(6, 1)).astype(np.float32)
    action, target, episodes = np.ones((6, 4), np.float32), np.zeros((6, 4)), np.arange(6, dtype=np.int64)
    batch.add(profile, context, action, target, np.array([0, 2]), episodes, 0, PolicyVersion(3, 4), capacity=4)
    assert batch.fits(2) and not batch.fits(3)
    batch.add(profile, context, action, target, np.array([1, 5]), episodes, 1, PolicyVersion(3, 5), capacity=4)
    with pytest.raises(ValueError, match="do not fit"):
        batch.add(profile, context, action, target, np.array([3]), episodes, 2, PolicyVersion(3, 5), capacity=4)
    first = batch.take()
    kept = {k: v.copy() for k, v in first.arrays().items()}
    batch.add(2 * profile, context, -action, target, np.array([0, 2, 4]), episodes, 2, PolicyVersion(9, 9),
              capacity=3)
    second = batch.take()
    for name, value in first.arrays().items():  # what the spool still holds is untouched
        np.testing.assert_array_equal(value, kept[name], err_msg=name)
    np.testing.assert_array_equal(first.observation["profile"], profile[[0, 2, 1, 5]])
    np.testing.assert_array_equal(first.step_index, [0, 0, 1, 1])
    np.testing.assert_array_equal(first.policy_count, [4, 4, 5, 5])
    np.testing.assert_allclose(first.reward, -0.25)  # ((1 - 0) / 2)^2 at every level
    assert len(second) == 3 and (second.policy_incarnation == 9).all()
    small = replace(CFG, levels=4, features=2, context=1, max_correction=2.0)
    Steps.from_arrays(second.arrays(), small.observation_spec(), small.action_spec())  # the learner's checks pass
    assert batch.take() is None


@pytest.mark.parametrize("key, bad, message", [
    ("target", np.nan, r"info\['target'\]: non-finite"),
    ("context", np.inf, r"info\['context'\]: non-finite"),
])
def test_non_finite_info_is_refused_before_anything_is_sent(tmp_path, key, bad, message):
    path = random_export(tmp_path, PolicyVersion(7, 0), cfg=CFG)
    link = CouplingLink(replace(CFG, explore=False), rank=0, policy=runtime.load(path))
    info = {"context": np.zeros((4, CFG.context)), "target": np.zeros((4, CFG.levels))}
    info[key][1, 0] = bad
    with pytest.raises(CouplingError, match=message):
        link.exchange(np.zeros((4, CFG.levels, CFG.features)), info)
    assert link.stats.exchanges == 0


def test_the_link_books_wall_and_cpu_time_apart_from_inference(tmp_path):
    served = ServedCoupling(CFG)
    try:
        path = served.export(tmp_path / "policy")  # the learner's own: rows acted under it are admitted
        link = CouplingLink(replace(CFG, learner=served.endpoint, send_every=2), rank=1,
                            policy=runtime.load(path), seed=0)
        before = io_threads_cpu_s()
        for state, info in _exchanges([200] * 20):
            link.exchange(state, info)
        link.close(flush_s=5.0)
        after = io_threads_cpu_s()
    finally:
        served.close()
    s = link.stats
    assert s.steps_sent == 20 * 200
    assert 0 < s.link_cpu_s <= s.link_s + 0.01  # one thread's CPU time cannot exceed the wall time
    assert s.inference_s > 0 and s.inference_cpu_s > 0
    if before is not None:  # Linux: the ZeroMQ I/O thread did the sending
        assert after > before


@pytest.mark.parametrize("n, fraction", [(17, 0.25), (704, 0.25), (5, 0.9), (3, 0.3)])
def test_streamed_columns_are_drawn_round_by_round_without_repeats(tmp_path, n, fraction):
    path = random_export(tmp_path, PolicyVersion(7, 0), cfg=CFG)
    link = CouplingLink(replace(CFG, stream_fraction=fraction), rank=0, policy=runtime.load(path), seed=3)
    k = max(1, round(fraction * n))
    counts = np.zeros(n, int)
    picks = [link._pick_rows(n) for _ in range(60)]
    for rows in picks:
        assert len(rows) == len(np.unique(rows)) == k
        counts[rows] += 1
    assert counts.max() - counts.min() <= 1  # every column streamed as often as any other, give or take one
    assert len({tuple(r) for r in picks}) > 1  # and not always the same ones


def test_a_stalled_batch_still_polls_the_learner(tmp_path):
    """Exchanges that stop completing the batch (the inference process died) still keep the link alive."""
    served = ServedCoupling(CFG)
    try:
        path = served.export(tmp_path / "policy")  # version (incarnation, 0)
        link = CouplingLink(replace(CFG, learner=served.endpoint, send_every=1000), rank=4,
                            policy=runtime.load(path), seed=0)
        link.POLL_AT_LEAST_S = 0.05
        state, info = next(_exchanges([6]))
        link.exchange(state, info)  # the batch is now part-filled: the per-batch poll will not come
        published = served.publish()  # the learner's own actor, as (incarnation, 1)
        deadline = time.monotonic() + 10
        while link.stats.weights_taken == 0 and time.monotonic() < deadline:
            link.exchange(state, info)
            time.sleep(0.02)
        assert link.stats.weights_taken == 1 and link.version == published == (runtime.load(path).version.incarnation, 1)
        link.close(flush_s=5.0)
    finally:
        served.close()


def test_a_batch_without_proposed_action_decodes_with_it_equal_to_action():
    """The wire schema: ``proposed_action`` absent means "equal to action"; present, it is its own column."""
    from embodyrl.hal.wire.codec import decode, encode

    small = replace(CFG, levels=4, features=2, context=1, max_correction=2.0)
    batch = ColumnBatch(levels=4, features=2, context=1, rank=3, max_correction=2.0)
    rng = np.random.default_rng(2)
    profile, context = rng.normal(size=(5, 4, 2)).astype(np.float32), rng.normal(size=(5, 1)).astype(np.float32)
    action = rng.uniform(-2, 2, size=(5, 4)).astype(np.float32)
    batch.add(profile, context, action, np.zeros((5, 4)), np.array([4, 1, 3]), np.arange(5, dtype=np.int64), 0,
              PolicyVersion(3, 4), capacity=3)
    wire = batch.take().arrays()
    assert "proposed_action" not in wire and "action" in wire
    received = decode(encode("STEPS", {"seq": 1}, wire)).arrays  # through the real codec
    steps = Steps.from_arrays(received, small.observation_spec(), small.action_spec())
    assert steps.proposed_action is steps.action
    np.testing.assert_array_equal(steps.action, action[[4, 1, 3]])
    assert "proposed_action" in steps.arrays()  # what a replay stores still has the column

    full = dict(received, proposed_action=np.zeros_like(received["action"]))  # a sender that sends it
    steps = Steps.from_arrays(full, small.observation_spec(), small.action_spec())
    np.testing.assert_array_equal(steps.proposed_action, 0)
    np.testing.assert_array_equal(steps.action, action[[4, 1, 3]])

    from embodyrl.hal.specs import SpecError
    for bad, message in ((dict(received, proposed_action=np.full_like(received["action"], np.nan)), "non-finite"),
                         ({k: v for k, v in received.items() if k != "action"}, r"missing \['action'\]")):
        with pytest.raises(SpecError, match=message):
            Steps.from_arrays(bad, small.observation_spec(), small.action_spec())


def test_a_float64_target_is_scored_in_float32_without_warnings():
    batch = ColumnBatch(levels=3, features=1, context=0, rank=0, max_correction=1.0)
    target = np.array([[0.5, 0.5, 0.5], [1e-3, 0.0, -1e-3]])
    action = np.array([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]], np.float32)
    with np.errstate(all="raise"):
        batch.add(np.zeros((2, 3, 1), np.float32), None, action, target, np.array([0, 1]),
                  np.zeros(2, np.int64), 0, PolicyVersion(1, 1), capacity=2)
    reward = batch.take().reward
    assert reward.dtype == np.float32
    np.testing.assert_allclose(reward, [0.0, -2e-6 / 3], rtol=1e-5)


def test_stream_every_streams_all_columns_on_every_nth_exchange_only(tmp_path):
    served = ServedCoupling(CFG)
    try:
        path = served.export(tmp_path / "policy")  # the learner's own: rows acted under it are admitted
        link = CouplingLink(replace(CFG, learner=served.endpoint, stream_fraction=1.0, stream_every=3, send_every=2),
                            rank=1, policy=runtime.load(path), seed=0)
        exchanges = list(_exchanges([6] * 9, seed=4))
        for k, (state, info) in enumerate(exchanges):
            if k % 3:  # a target that is not read this time is not checked either
                info = {**info, "target": np.full_like(info["target"], np.nan)}
            link.exchange(state, info)
        with pytest.raises(CouplingError, match=r"info\['target'\]: non-finite"):  # exchange 9 streams
            link.exchange(exchanges[0][0], {**exchanges[0][1], "target": np.full((6, CFG.levels), np.inf)})
        link.close(flush_s=5.0)
        served.wait(lambda c: c.steps_by_rank.get(1, 0) >= 18, timeout_s=5)
    finally:
        served.close()
    received = [t.steps for t in served.taken]
    assert link.stats.steps_sent == 3 * 6  # exchanges 0, 3 and 6, every column
    got = sorted((int(s.step_index[i]), round(float(s.observation["profile"][i, 0, 0]), 5))
                 for s in received for i in range(len(s)))
    want = sorted((j, round(float(np.float32(exchanges[k][0][c, 0, 0])), 5))
                  for j, k in enumerate((0, 3, 6)) for c in range(6))
    assert got == want
    assert all(np.isfinite(s.reward).all() for s in received)


def test_counts_below_one_are_refused(tmp_path):
    path = random_export(tmp_path, PolicyVersion(7, 0), cfg=CFG)
    for name in ("stream_every", "send_every"):
        with pytest.raises(CouplingError, match=name):
            CouplingLink(replace(CFG, **{name: 0}), rank=0, policy=runtime.load(path))


def test_inference_in_blocks_of_columns_gives_the_same_corrections(tmp_path):
    path = random_export(tmp_path, PolicyVersion(7, 0), cfg=CFG)
    state, info = next(_exchanges([7], seed=5))
    answers = []
    for rows in (0, 2 * CFG.levels, 3 * CFG.levels, 10_000 * CFG.levels):  # whole, blocks of 2 and 3, one block
        link = CouplingLink(replace(CFG, explore=False, inference_rows=rows), rank=0, policy=runtime.load(path))
        answers.append(link.exchange(state, info))
    for answer in answers[1:]:
        np.testing.assert_allclose(answer, answers[0], rtol=1e-6, atol=1e-7)
    assert np.abs(answers[0]).max() > 0  # a real policy answered
