"""The persistent replay serves what the step record implies: hand-computed n-step returns,
sequences within episodes, source mixing in proportion, staleness filters, priorities."""

import numpy as np
import pytest

from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import PolicyVersion, Source, StepRecorder
from embodyrl.replay import PersistentReplay

OBS = DictSpec.of(ArraySpec("x", (1,), np.float32))
ACT = ArraySpec("action", (1,), np.float32, -1, 1)
V = PolicyVersion(7, 3)


def obs(value):
    return {"x": np.array([value], np.float32)}


def record_episode(recorder, values, *, terminated=False, truncated=True, version=V, source=Source.ONLINE):
    """o_t = values[t]; the reward of row t is 10 * o_t; ends with a final row."""
    for t, v in enumerate(values[:-1]):
        last = t == len(values) - 2
        recorder.add(obs(v), np.array([0.5], np.float32), np.array([0.5], np.float32), 10.0 * v,
                     terminated and last, truncated and last and not terminated, version, source=source)
    recorder.add_final(obs(values[-1]))


def transitions(replay, n_step=1, gamma=0.9, draws=4000, **kw):
    batch = replay.sample(np.random.default_rng(0), draws, gamma, n_step, **kw)
    return {(float(o), float(no), round(float(r), 4), round(float(d), 5)) for o, no, r, d in zip(
        batch["observation"]["x"][:, 0], batch["next_observation"]["x"][:, 0],
        batch["reward"], batch["discount"], strict=True)}


@pytest.fixture
def replay(tmp_path):
    r = PersistentReplay(tmp_path / "replay", OBS, ACT, capacity=64, chunk_rows=8)
    yield r
    r.close()


def test_one_step_transitions_match_the_in_memory_semantics(replay):
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    record_episode(rec, [0.0, 1.0, 2.0], terminated=True)
    record_episode(rec, [10.0, 11.0, 12.0], truncated=True)
    replay.add(rec.flush())
    assert transitions(replay) == {
        (0.0, 1.0, 0.0, 0.9), (1.0, 2.0, 10.0, 0.0), (10.0, 11.0, 100.0, 0.9), (11.0, 12.0, 110.0, 0.9)}


def test_n_step_returns_against_a_hand_computation_across_both_episode_ends(replay):
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    record_episode(rec, [1.0, 2.0, 3.0, 4.0], terminated=True)   # rewards 10, 20, 30; terminates
    record_episode(rec, [5.0, 6.0, 7.0, 8.0], truncated=True)    # rewards 50, 60, 70; truncated
    replay.add(rec.flush())
    g = 0.9
    assert transitions(replay, n_step=3, gamma=g) == {
        # terminated within the window: discount 0, reward sums to the end
        (1.0, 4.0, round(10 + g * 20 + g * g * 30, 4), 0.0),
        (2.0, 4.0, round(20 + g * 30, 4), 0.0),
        (3.0, 4.0, 30.0, 0.0),
        # truncation bootstraps from the final observation with gamma^k
        (5.0, 8.0, round(50 + g * 60 + g * g * 70, 4), round(g ** 3, 5)),
        (6.0, 8.0, round(60 + g * 70, 4), round(g ** 2, 5)),
        (7.0, 8.0, 70.0, round(g, 5)),
    }


def test_n_step_stops_where_the_successor_has_not_arrived(replay):
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    for v in (0.0, 1.0, 2.0):
        rec.add(obs(v), np.zeros(1, np.float32), np.zeros(1, np.float32), v, False, False, V)
    replay.add(rec.flush())
    # rows 0, 1, 2 stored, row 2's successor not yet: starts 0 and 1 only
    assert transitions(replay, n_step=3, gamma=0.5) == {(0.0, 2.0, 0.5, 0.25), (1.0, 2.0, 1.0, 0.5)}
    rec.add(obs(3.0), np.zeros(1, np.float32), np.zeros(1, np.float32), 3.0, False, True, V)
    rec.add_final(obs(4.0))
    replay.add(rec.flush())
    assert (0.0, 3.0, round(0 + 0.5 * 1 + 0.25 * 2, 4), 0.125) in transitions(replay, n_step=3, gamma=0.5)


def test_sequences_stay_within_one_episode(replay):
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    record_episode(rec, [0.0, 1.0, 2.0, 3.0])
    record_episode(rec, [10.0, 11.0])
    replay.add(rec.flush())
    seq = replay.sample_sequences(np.random.default_rng(0), 200, 3)
    runs = {tuple(r) for r in seq["observation"]["x"][:, :, 0].tolist()}
    assert runs == {(0.0, 1.0, 2.0), (1.0, 2.0, 3.0)}
    assert seq["final"].shape == (200, 3) and seq["final"][:, 2].any() and not seq["final"][:, :2].any()
    with pytest.raises(RuntimeError, match="too few runs of 9 rows"):
        replay.sample_sequences(np.random.default_rng(0), 4, 9)


def test_source_mixing_holds_its_proportions_and_is_uniform_within_a_source(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=4096, chunk_rows=256)
    demo = StepRecorder(OBS, ACT, actor_id=1, device_id=0)
    online = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    for e in range(4):  # 40 demonstration transitions, 1000 online ones
        record_episode(demo, [100_000.0 + 100 * e + t for t in range(11)], source=Source.DEMONSTRATION)
        replay.add(demo.flush())
    for e in range(100):
        record_episode(online, [float(100 * e + t) for t in range(11)])
        replay.add(online.flush())
    batch = replay.sample(np.random.default_rng(2), 20_000, 0.9,
                          mix={Source.DEMONSTRATION: 0.5, Source.ONLINE: 0.5})
    x = batch["observation"]["x"][:, 0]
    demo_rows = x >= 100_000
    assert demo_rows.sum() == 10_000
    _, counts = np.unique(x[demo_rows], return_counts=True)
    assert len(counts) == 40 and counts.min() > 0.75 * 250 and counts.max() < 1.25 * 250
    with pytest.raises(RuntimeError, match="no rows of source INTERVENTION"):
        replay.sample(np.random.default_rng(2), 8, 0.9, mix={Source.INTERVENTION: 1.0})
    replay.close()


def test_staleness_filter_keeps_recent_policies_only(replay):
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    record_episode(rec, [0.0, 1.0], version=PolicyVersion(7, 1))
    record_episode(rec, [10.0, 11.0], version=PolicyVersion(7, 5))
    record_episode(rec, [20.0, 21.0], version=PolicyVersion(9, 6))  # another incarnation
    replay.add(rec.flush())
    got = transitions(replay, max_staleness=2, latest=PolicyVersion(7, 6))
    assert {t[0] for t in got} == {10.0}
    with pytest.raises(ValueError, match="needs latest"):
        replay.sample(np.random.default_rng(0), 4, 0.9, max_staleness=2)


def test_priorities_are_proportional_and_ignore_overwritten_rows(tmp_path):
    replay = PersistentReplay(tmp_path / "r", OBS, ACT, capacity=32, chunk_rows=8, prioritized=True,
                              priority_exponent=1.0)
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    record_episode(rec, [0.0, 1.0, 2.0, 3.0])  # three transitions
    replay.add(rec.flush())
    batch = replay.sample(np.random.default_rng(0), 64, 0.9, keys=True)
    by_x = {float(x): (int(s), int(g)) for x, s, g in zip(batch["observation"]["x"][:, 0], batch["slot"],
                                                           batch["generation"], strict=True)}
    slots = np.array([by_x[v][0] for v in (0.0, 1.0, 2.0)])
    gens = np.array([by_x[v][1] for v in (0.0, 1.0, 2.0)])
    assert replay.update_priorities(slots, gens, np.array([1.0, 3.0, 6.0])) == 3
    x = replay.sample(np.random.default_rng(1), 30_000, 0.9)["observation"]["x"][:, 0]
    share = np.array([(x == v).mean() for v in (0.0, 1.0, 2.0)])
    np.testing.assert_allclose(share, [0.1, 0.3, 0.6], atol=0.02)
    # overwrite everything: the old keys no longer apply
    for e in range(10):
        record_episode(rec, [100.0 * (e + 1) + t for t in range(4)])
        replay.add(rec.flush())
    assert replay.update_priorities(slots, gens, np.array([50.0, 50.0, 50.0])) == 0
    replay.close()


def test_too_few_transitions_is_a_clear_error(replay):
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    rec.add(obs(0.0), np.zeros(1, np.float32), np.zeros(1, np.float32), 0.0, False, False, V)
    replay.add(rec.flush())
    with pytest.raises(RuntimeError, match="too few complete transitions"):
        replay.sample(np.random.default_rng(0), 4, 0.9)


def test_prefetcher_hands_over_batches_in_order_and_reraises_errors():
    from embodyrl.replay import Prefetcher

    produced = iter(range(5))

    def make():
        value = next(produced)
        if value == 3:
            raise ValueError("replay broke")
        return value

    prefetch = Prefetcher(make, depth=2)
    assert [prefetch.get(timeout_s=5) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="replay broke"):
        prefetch.get(timeout_s=5)
    with pytest.raises(TimeoutError, match="no batch prefetched"):
        prefetch.get(timeout_s=0.05)
    prefetch.close()


@pytest.mark.parametrize("row_bytes", [392, 4096, 5000, 21304])
def test_hinted_ranges_are_exactly_the_pages_of_each_row_and_its_successor(row_bytes):
    """``will_need`` hints each run of pages once: their union is the pages of every drawn row and the
    row after it (clipped to the file), and no two ranges touch (each would be one read)."""
    import mmap
    import types

    from embodyrl.replay.pages import PageHints

    advised = []
    capacity = 5000
    fake = types.SimpleNamespace(row_bytes=row_bytes, layout=types.SimpleNamespace(capacity=capacity),
                                 _mmap=types.SimpleNamespace(madvise=lambda how, start, length: advised.append(
                                     (how, start, length))))
    slots = np.random.default_rng(row_bytes).integers(0, capacity, 300)
    PageHints.will_need(fake, slots)
    page = mmap.PAGESIZE
    ranges = sorted({(start // page, (start + length) // page - 1) for how, start, length in advised
                     if how == mmap.MADV_WILLNEED})
    got = {p for a, b in ranges for p in range(a, b + 1)}
    end = capacity * row_bytes - 1
    want = {p for s in slots.tolist() for p in range(s * row_bytes // page,
                                                     min((s + 2) * row_bytes - 1, end) // page + 1)}
    assert got == want
    assert all(a2 > b1 + 1 for (_, b1), (a2, _) in zip(ranges, ranges[1:], strict=False))


def test_candidates_cover_the_need_with_a_margin_that_shrinks_as_rows_are_valid():
    from embodyrl.replay.persistent import candidates

    assert candidates(256, 1.0) == 258
    assert 256 / 0.99 < candidates(256, 0.99) < 256 / 0.99 + 10
    assert candidates(256, 0.5) > 512 + 4 * 11
