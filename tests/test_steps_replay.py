import numpy as np
import pytest

from embodyrl.hal.specs import ArraySpec, DictSpec, SpecError
from embodyrl.hal.steps import PolicyVersion, Source, StepRecorder, Steps
from embodyrl.replay import PersistentReplay

OBS = DictSpec.of(ArraySpec("x", (1,), np.float32))
ACT = ArraySpec("action", (1,), np.float32, -1, 1)
V = PolicyVersion(7, 3)


def obs(value):
    return {"x": np.array([value], np.float32)}


def record_episode(recorder, values, *, terminated=False, truncated=True):
    """o_t = values[t]; the reward of row t is 10 * o_t; ends with a final row."""
    for t, v in enumerate(values[:-1]):
        last = t == len(values) - 2
        recorder.add(obs(v), np.array([0.5], np.float32), np.array([0.75], np.float32), 10.0 * v,
                     terminated and last, truncated and last and not terminated, V, log_prob=-1.0)
    recorder.add_final(obs(values[-1]))


def test_recorder_rows_follow_the_step_record():
    rec = StepRecorder(OBS, ACT, actor_id=3, device_id=1, capacity=16)
    record_episode(rec, [0.0, 1.0, 2.0], terminated=True)
    steps = rec.flush()
    assert len(steps) == 3 and steps.env_steps == 2
    np.testing.assert_array_equal(steps.observation["x"][:, 0], [0, 1, 2])
    np.testing.assert_array_equal(steps.final, [False, False, True])
    np.testing.assert_array_equal(steps.terminated, [False, True, False])
    np.testing.assert_array_equal(steps.step_index, [0, 1, 2])
    assert len(set(steps.episode_id.tolist())) == 1
    np.testing.assert_array_equal(steps.action[:, 0], [0.5, 0.5, 0])
    np.testing.assert_array_equal(steps.proposed_action[:, 0], [0.75, 0.75, 0])
    assert (steps.policy_count[:2] == 3).all() and (steps.source == Source.ONLINE).all()
    assert (steps.actor_id == 3).all() and (steps.device_id == 1).all()
    assert rec.flush() is None
    record_episode(rec, [5.0, 6.0])
    assert rec.flush().episode_id[0] != steps.episode_id[0]


def test_steps_survive_from_arrays_and_reject_bad_columns():
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    record_episode(rec, [0.0, 1.0, 2.0])
    arrays = rec.flush().arrays()
    again = Steps.from_arrays(arrays, OBS, ACT)
    np.testing.assert_array_equal(again.reward, arrays["reward"])
    bad = dict(arrays, reward=arrays["reward"].astype(np.float64))
    with pytest.raises(SpecError, match="reward: dtype float64"):
        Steps.from_arrays(bad, OBS, ACT)
    nan = dict(arrays, **{"observation/x": np.full((3, 1), np.nan, np.float32)})
    with pytest.raises(SpecError, match="x: non-finite"):
        Steps.from_arrays(nan, OBS, ACT)
    out_of_bounds = dict(arrays, action=np.full((3, 1), 3.0, np.float32))
    with pytest.raises(SpecError, match=r"action: row 0 element \[0\] holds 3, outside \[-1, 1\]"):
        Steps.from_arrays(out_of_bounds, OBS, ACT)
    short = dict(arrays, terminated=arrays["terminated"][:2])
    with pytest.raises(SpecError, match="terminated: shape"):
        Steps.from_arrays(short, OBS, ACT)
    missing = {k: v for k, v in arrays.items() if k != "source"}
    with pytest.raises(SpecError, match="missing \\['source'\\]"):
        Steps.from_arrays(missing, OBS, ACT)
    both = dict(arrays, terminated=np.array([0, 1, 0], bool), truncated=np.array([0, 1, 0], bool))
    with pytest.raises(SpecError, match="both terminated and truncated"):
        Steps.from_arrays(both, OBS, ACT)


def test_from_arrays_refuses_values_beyond_their_bounds_naming_column_row_and_value():
    bounded_obs = DictSpec.of(ArraySpec("x", (1,), np.float32), ArraySpec("angle", (2,), np.float32, -1, 1),
                              ArraySpec("image", (2, 2, 3), np.uint8, 0, 255))
    rec = StepRecorder(bounded_obs, ACT, actor_id=0, device_id=0)
    for v in (0.1, 0.2, 0.3):
        rec.add({"x": obs(v)["x"], "angle": np.array([v, -v], np.float32), "image": np.zeros((2, 2, 3), np.uint8)},
                np.array([0.5], np.float32), np.array([0.5], np.float32), 1.0, False, False, V)
    rec.add_final({"x": obs(9.0)["x"], "angle": np.zeros(2, np.float32), "image": np.zeros((2, 2, 3), np.uint8)})
    arrays = rec.flush().arrays()
    Steps.from_arrays(arrays, bounded_obs, ACT)

    def refused(column, row, value, **kwargs):
        bad = {k: v.copy() for k, v in arrays.items()}
        bad[column][row] = value
        with pytest.raises(SpecError) as err:
            Steps.from_arrays(bad, bounded_obs, ACT, **kwargs)
        return str(err.value)

    assert refused("reward", 1, 3e38) == "reward: row 1 holds 3e+38, beyond the bound |reward| <= 1e+06"
    assert refused("reward", 2, 50.0, reward_bound=10.0).startswith("reward: row 2 holds 50,")
    assert refused("proposed_action", 0, 1e30).startswith("proposed_action: row 0 element [0] holds 1e+30")
    assert refused("step_index", 2, -7).startswith("step_index: row 2 holds -7")
    assert refused("log_prob", 1, -1e9).startswith("log_prob: row 1 holds -1e+09")
    assert refused("policy_count", 0, -5).startswith("policy_count: row 0 holds -5")
    assert refused("observation/angle", 3, [0.0, 1.5]).startswith("observation/angle: row 3 element [1] holds 1.5")
    fine = {k: v.copy() for k, v in arrays.items()}
    fine["observation/x"][1] = 1e9  # an unbounded field may hold any finite value
    fine["proposed_action"][0] = 3.0  # an unclipped proposal (PPO's Gaussian sample) beyond the action's bounds
    fine["proposed_action"][3] = fine["action"][3] = 1e30  # a final row's action is never read
    Steps.from_arrays(fine, bounded_obs, ACT)


def all_transitions(replay, n=4000):
    batch = replay.sample(np.random.default_rng(0), n, discount=0.9)
    return {(float(o), float(no), float(r), round(float(d), 5)) for o, no, r, d in zip(
        batch["observation"]["x"][:, 0], batch["next_observation"]["x"][:, 0],
        batch["reward"], batch["discount"], strict=True)}


def replay_at(path, capacity=4096):
    return PersistentReplay(path, OBS, ACT, capacity=capacity, chunk_rows=64)


def test_termination_stops_bootstrapping_and_truncation_does_not(tmp_path):
    replay = replay_at(tmp_path)
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    record_episode(rec, [0.0, 1.0, 2.0], terminated=True)
    record_episode(rec, [10.0, 11.0, 12.0], truncated=True)
    replay.add(rec.flush())
    assert all_transitions(replay) == {
        (0.0, 1.0, 0.0, 0.9), (1.0, 2.0, 10.0, 0.0),
        (10.0, 11.0, 100.0, 0.9), (11.0, 12.0, 110.0, 0.9),
    }


def test_interleaved_streams_link_next_rows_by_index(tmp_path):
    replay = replay_at(tmp_path)
    a = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    b = StepRecorder(OBS, ACT, actor_id=1, device_id=0)
    # actor 0 sends its episode in two batches, with actor 1's batch in between
    for v in (0.0, 1.0):
        a.add(obs(v), np.zeros(1, np.float32), np.zeros(1, np.float32), v, False, False, V)
    replay.add(a.flush())
    record_episode(b, [100.0, 101.0])
    replay.add(b.flush())
    assert {t[:2] for t in all_transitions(replay)} == {(0.0, 1.0), (100.0, 101.0)}
    a.add(obs(2.0), np.zeros(1, np.float32), np.zeros(1, np.float32), 2.0, False, True, V)
    a.add_final(obs(3.0))
    replay.add(a.flush())
    assert {t[:2] for t in all_transitions(replay)} == {(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (100.0, 101.0)}


def test_sampling_is_uniform_over_transitions(tmp_path):
    replay = replay_at(tmp_path, capacity=10_240)
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0, capacity=64)
    for e in range(20):
        record_episode(rec, [float(e * 100 + t) for t in range(11)])  # 10 transitions each
        replay.add(rec.flush())
    draws = replay.sample(np.random.default_rng(1), 200_000, 0.9)["observation"]["x"][:, 0]
    _, counts = np.unique(draws, return_counts=True)
    assert len(counts) == 200
    assert counts.min() > 0.85 * 1000 and counts.max() < 1.15 * 1000


def test_too_few_transitions_is_a_clear_error(tmp_path):
    replay = replay_at(tmp_path)
    rec = StepRecorder(OBS, ACT, actor_id=0, device_id=0)
    rec.add(obs(0.0), np.zeros(1, np.float32), np.zeros(1, np.float32), 0.0, False, False, V)
    replay.add(rec.flush())
    with pytest.raises(RuntimeError, match="too few complete transitions"):
        replay.sample(np.random.default_rng(0), 4, 0.9)


@pytest.mark.parametrize("rows", [1, 8, 64, 300])
def test_a_nan_or_infinity_in_any_float_column_is_refused_by_name_at_any_batch_size(rows):
    """The checks' fast path takes a float column's extremes for its finiteness too: a small column's
    in Python, whose min and max skip a NaN, so that path must see the NaN another way."""
    from embodyrl.bench.transport import CHEETAH_ACTION, CHEETAH_SPEC, _batch
    from embodyrl.hal.steps import StepsCheck

    arrays = _batch(CHEETAH_SPEC, CHEETAH_ACTION, rows, 1, 1).arrays()
    check = StepsCheck(CHEETAH_SPEC, CHEETAH_ACTION)
    check.steps(arrays)
    for name in ("reward", "log_prob", "observation/state", "action", "proposed_action"):
        for value in (np.nan, np.inf, -np.inf):
            bad = arrays[name].copy()
            bad.flat[bad.size // 2] = value
            with pytest.raises(SpecError, match=name.split("/")[-1]):
                check.steps({**arrays, name: bad}, reward_bound=np.inf)
