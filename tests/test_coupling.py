"""The coupling link in one process: input checks, the per-level windows, the inference process,
parity of the exported per-level actor with JAX, and the coupling learner learning a known target."""

import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embodyrl.coupling.testing import ServedCoupling, random_export
from embodyrl.hal.coupling.inference import InferenceServer
from embodyrl.hal.coupling.link import CouplingConfig, CouplingError, CouplingLink, level_inputs
from embodyrl.hal.runtime import NumpyPolicy
from embodyrl.hal.steps import PolicyVersion
from tests.test_coupling_mpi import CFG


def test_level_inputs_take_a_window_of_levels_then_the_context():
    profile = np.arange(5 * 2, dtype=np.float32).reshape(1, 5, 2)  # level k: (2k, 2k+1)
    context = np.array([[7.0, 8.0]], np.float32)
    x = level_inputs(profile, context, radius=1)
    assert x.shape == (1, 5, 3 * 2 + 2)
    np.testing.assert_array_equal(x[0, 2], [2, 3, 4, 5, 6, 7, 7, 8])  # levels 1, 2, 3
    np.testing.assert_array_equal(x[0, 0], [0, 1, 0, 1, 2, 3, 7, 8])  # bottom edge repeated
    np.testing.assert_array_equal(x[0, 4], [6, 7, 8, 9, 8, 9, 7, 8])  # top edge repeated


@pytest.fixture
def local_link(tmp_path):
    path = random_export(tmp_path, PolicyVersion(7, 0), cfg=CFG)
    from embodyrl.hal import runtime

    return CouplingLink(replace(CFG, explore=False), rank=0, policy=runtime.load(path))


@pytest.mark.parametrize("state, info, message", [
    (np.zeros((4, 12, 3), np.int32), {}, "state: a float32 or float64"),
    (np.zeros((4, 11, 3)), {}, r"state: shape \(4, 11, 3\)"),
    (np.full((4, 12, 3), np.nan), {}, "state: non-finite"),
    (np.zeros((4, 12, 3)), {"context": np.zeros((3, 2))}, r"info\['context'\]: shape \(3, 2\)"),
    (np.zeros((4, 12, 3)), {"context": np.zeros((4, 2)), "target": np.zeros(4)}, r"info\['target'\]"),
])
def test_bad_tensors_are_refused_with_the_field_named(local_link, state, info, message):
    with pytest.raises(CouplingError, match=message):
        local_link.exchange(state, info)
    assert local_link.stats.exchanges == 0


def test_corrections_cover_exactly_the_columns_given_and_stay_bounded(local_link):
    rng = np.random.default_rng(0)
    for n in (1, 9, 40):
        state = rng.normal(size=(n, 12, 3)) * 10
        out = local_link.exchange(state, {"context": rng.normal(size=(n, 2))})
        assert out.shape == (n, 12) and out.dtype == np.float64
        assert np.abs(out).max() <= CFG.max_correction and np.abs(out).max() > 0
        fortran = local_link.exchange(np.asfortranarray(state), {"context": np.zeros((n, 2))})
        np.testing.assert_array_equal(fortran, local_link.exchange(state, {"context": np.zeros((n, 2))}))


def test_a_policy_for_another_shape_is_refused(tmp_path):
    path = random_export(tmp_path, PolicyVersion(7, 0), cfg=CFG)
    from embodyrl.hal import runtime

    with pytest.raises(CouplingError, match="policy reads"):
        CouplingLink(replace(CFG, radius=2), rank=0, policy=runtime.load(path))
    with pytest.raises(CouplingError, match="either a policy"):
        CouplingLink(CFG, rank=0)


def test_a_nearby_inference_process_answers_like_the_local_replica_and_its_death_costs_one_deadline(tmp_path):
    from embodyrl.hal import runtime

    path = random_export(tmp_path, PolicyVersion(7, 3), cfg=CFG)
    server = InferenceServer(runtime.load(path), radius=CFG.radius)
    stop = threading.Event()
    thread = threading.Thread(target=lambda: [server.serve_once(20) for _ in iter(stop.is_set, True)], daemon=True)
    thread.start()
    remote = CouplingLink(replace(CFG, inference=server.endpoint, inference_timeout_s=2.0), rank=1)
    local = CouplingLink(replace(CFG, explore=False), rank=1, policy=runtime.load(path))
    rng = np.random.default_rng(1)
    state, info = rng.normal(size=(6, 12, 3)).astype(np.float32), {"context": rng.normal(size=(6, 2))}
    try:
        np.testing.assert_allclose(remote.exchange(state, info), local.exchange(state, info), rtol=1e-6)
        assert remote.version == PolicyVersion(7, 3) and remote.stats.inference_s > 0
    finally:
        stop.set()
        thread.join(5)
        server.close()
    dead = CouplingLink(replace(CFG, inference=server.endpoint, inference_timeout_s=0.3), rank=1)
    t0 = time.monotonic()
    out = dead.exchange(state, info)
    assert not out.any() and out.shape == (6, 12) and time.monotonic() - t0 < 2.0
    assert dead.stats.warnings["inference_timeout"] == 1 and dead.stats.zero_answers == 1
    remote.close()
    dead.close()


def test_the_exported_per_level_actor_matches_jax():
    pytest.importorskip("jax")
    from embodyrl.coupling.learner import CouplingLearner, CouplingLearnerConfig

    cfg = CouplingConfig(levels=8, features=2, context=1, radius=1, max_correction=2.0)
    learner = CouplingLearner(cfg, CouplingLearnerConfig(min_steps=10))
    try:
        rng = np.random.default_rng(0)
        obs = {"profile": rng.normal(size=(32, 8, 2)).astype(np.float32),
               "context": rng.normal(size=(32, 1)).astype(np.float32)}
        policy = NumpyPolicy(*learner.export())
        jax_action = np.asarray(learner.networks.policy(learner.state.actor_params, obs))
        numpy_action = policy.mean_action({"window": level_inputs(obs["profile"], obs["context"], 1)})[..., 0]
        np.testing.assert_allclose(numpy_action, jax_action, atol=1e-5)
        assert np.abs(jax_action).max() > 1e-3
        with pytest.raises(ValueError, match="discount must be 0"):
            CouplingLearner(cfg, CouplingLearnerConfig(ddpg=replace(CouplingLearnerConfig().ddpg, discount=0.9)))
    finally:
        learner.close()


@pytest.mark.slow
def test_the_coupling_learner_learns_a_state_dependent_target_through_a_real_link():
    pytest.importorskip("jax")
    from embodyrl.coupling.learner import CouplingLearner, CouplingLearnerConfig

    cfg = CouplingConfig(levels=8, features=2, context=1, radius=1, max_correction=2.0)
    learner = CouplingLearner(cfg, CouplingLearnerConfig(min_steps=200, updates_per_call=50, publish_every=50, ddpg=replace(CouplingLearnerConfig().ddpg, hidden_sizes=(32, 32), batch_size=32)))
    try:
        policy = NumpyPolicy(*learner.export())
        rng = np.random.default_rng(0)
        profile = rng.normal(size=(32, 8, 2)).astype(np.float32)
        context = rng.normal(size=(32, 1)).astype(np.float32)
        obs = {"profile": profile, "context": context}

        def target(p, c):  # a state-dependent correction a constant cannot give
            return 1.5 * np.tanh(p[..., 0] + 0.5 * c)

        server = threading.Thread(target=learner.run, args=(60.0, lambda: learner.updates >= 800), daemon=True)
        server.start()
        link = CouplingLink(replace(cfg, learner=learner.endpoint, connect_timeout_s=20.0), rank=3,
                            policy=policy, seed=0)
        while server.is_alive():
            p = rng.normal(size=(16, 8, 2)).astype(np.float32)
            c = rng.normal(size=(16, 1)).astype(np.float32)
            link.exchange(p, {"context": c, "target": target(p, c)})
            time.sleep(0.002)
        server.join()
        assert learner.steps_by_rank[3] > 1000 and link.stats.weights_taken >= 1
        goal = target(profile, context)
        best_constant = np.mean(np.abs(goal - np.median(goal)))
        after = np.mean(np.abs(np.asarray(learner.networks.policy(learner.state.actor_params, obs)) - goal))
        assert after < 0.75 * best_constant, (best_constant, after)  # it learnt the state dependence
        link.close(flush_s=1.0)
    finally:
        learner.close()


def test_steps_of_several_exchanges_leave_in_one_message(tmp_path):
    from embodyrl.hal import runtime

    served = ServedCoupling(CFG)
    try:  # the learner's own export: its server refuses rows acted under an incarnation it never had
        path = served.export(tmp_path / "policy")
        link = CouplingLink(replace(CFG, learner=served.endpoint, send_every=3, stream_fraction=0.5), rank=2,
                            policy=runtime.load(path), seed=0)
        rng = np.random.default_rng(2)
        for _ in range(7):
            link.exchange(rng.normal(size=(10, 12, 3)), {"context": np.zeros((10, 2)), "target": np.zeros((10, 12))})
        link.close(flush_s=5.0)
        served.wait(lambda c: c.steps_by_rank.get(2, 0) >= 35, timeout_s=5)
    finally:
        served.close()
    # three messages (seqs 1 to 3): 3 + 3 + 1 exchanges (the server may hand queued ones on joined)
    assert served.rows()[(2, 2)] == 7 * 5 == link.stats.steps_sent and served.taken[-1].seq == 3


def test_coupling_benchmark_quick_reports_finite_named_figures():
    from embodyrl.bench import run

    res = run("coupling", quick=True)
    for key in ("model_step_ms", "link_ms", "inference_ms", "link_overhead_fraction", "inference_fraction",
                "model_step_cpu_ms", "link_cpu_ms", "link_overhead_fraction_cpu", "link_overhead_fraction_wall",
                "inference_fraction_wall"):
        assert np.isfinite(res[key]) and res[key] > 0, key
    assert res["link_overhead_fraction"] == res["link_overhead_fraction_cpu"]
    per_column = res["us_per_column_step"]
    assert abs(per_column["inference"] / per_column["physics"] - res["inference_fraction"]) < 1e-6
    assert all(per_column[k] > 0 for k in ("physics", "link", "inference")) and "MLP" in per_column["inference_network"]
    streamed = -(-res["steps"] // res["stream_every"])  # exchanges 0, every, 2 every, ...
    assert res["zero_answers"] == 0
    assert res["steps_sent"] == streamed * round(res["stream_fraction"] * res["columns"])
    assert res["steps_acknowledged"] == res["steps_sent"]  # the learner took every row it was sent


C_EXAMPLE = Path(__file__).parent.parent / "examples" / "c" / "coupling_infer.c"


@pytest.mark.skipif(shutil.which("cc") is None or not Path("/usr/include/zmq.h").exists(),
                    reason="needs a C compiler and libzmq headers (apt-get install libzmq3-dev)")
def test_the_c_example_gets_the_same_corrections_as_the_python_replica(tmp_path):
    from embodyrl.hal import runtime

    binary = tmp_path / "coupling_infer"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-o", str(binary), str(C_EXAMPLE), "-lzmq"], check=True,
                   timeout=120)
    path = random_export(tmp_path, PolicyVersion(7, 3), cfg=CFG)
    server = InferenceServer(runtime.load(path), radius=CFG.radius)
    stop = threading.Event()
    thread = threading.Thread(target=lambda: [server.serve_once(20) for _ in iter(stop.is_set, True)], daemon=True)
    thread.start()
    rng = np.random.default_rng(4)
    profile = rng.normal(size=(9, 12, 3)).astype(np.float32)
    context = rng.normal(size=(9, 2)).astype(np.float32)
    (tmp_path / "in.f32").write_bytes(profile.tobytes() + context.tobytes())
    args = [str(binary), server.endpoint, "3", "9", "12", "3", "2", str(tmp_path / "in.f32"), str(tmp_path / "out.f32")]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    finally:
        stop.set()
        thread.join(5)
        server.close()
    assert done.returncode == 0, done.stderr
    got = np.frombuffer((tmp_path / "out.f32").read_bytes(), np.float32).reshape(9, 12)
    local = CouplingLink(replace(CFG, explore=False), rank=3, policy=runtime.load(path))
    np.testing.assert_allclose(got, local.exchange(profile, {"context": context}), rtol=1e-6)
    assert server.answered == 1
    t0 = time.monotonic()  # nobody answers now: zero correction within the C side's deadline
    late = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert late.returncode == 2 and time.monotonic() - t0 < 10
    assert not np.frombuffer((tmp_path / "out.f32").read_bytes(), np.float32).any()


def test_a_horizon_reward_is_the_mean_score_of_the_next_exchanges_and_a_restart_drops_the_rest(tmp_path):
    """Corrections applied to a free-running model: row t's reward is the mean of the scores the model
    reports at exchanges t+1..t+k, for the same column; rows whose horizon a restart cuts are dropped."""
    from embodyrl.hal import runtime

    served = ServedCoupling(CFG)
    k, n = 3, 4
    try:
        path = served.export(tmp_path / "policy")  # the learner's own: rows acted under it are admitted
        link = CouplingLink(replace(CFG, learner=served.endpoint, reward_horizon=k, send_every=2), rank=1,
                            policy=runtime.load(path), seed=0)
        rng = np.random.default_rng(1)
        scores = []
        for t in range(6):
            if t == 5:
                assert link.restart() == 3 * n  # exchanges 2, 3 and 4 had seen 2, 1 and 0 scores
            scores.append(-np.arange(n) - 10.0 * t)
            state = rng.normal(size=(n, 12, 3))
            state[:, 0, 0] = np.arange(n)  # each row says which column it is
            link.exchange(state, {"context": np.zeros((n, 2)), "score": scores[-1]})
        with pytest.raises(CouplingError, match="score"):
            link.exchange(rng.normal(size=(n, 12, 3)), {"context": np.zeros((n, 2))})
        link.close(flush_s=5.0)
        served.wait(lambda c: c.steps_by_rank.get(1, 0) >= 2 * n, timeout_s=5)
    finally:
        served.close()
    steps = [t.steps for t in served.taken]
    assert sum(len(s) for s in steps) == 2 * n == link.stats.steps_sent  # exchanges 0 and 1 only
    rewards = np.concatenate([s.reward for s in steps])
    index = np.concatenate([s.step_index for s in steps])
    column = np.concatenate([s.observation["profile"][:, 0, 0] for s in steps])
    expected = [np.mean([-c - 10.0 * (t + j) for j in range(1, k + 1)]) for t, c in zip(index, column, strict=True)]
    np.testing.assert_allclose(rewards, expected, rtol=1e-6)
    assert sorted(set(index.tolist())) == [0, 1] and (np.concatenate([s.terminated for s in steps])).all()


def test_a_rank_silent_longer_than_the_learner_waits_says_hello_again_and_its_rows_arrive(tmp_path):
    """A model busy elsewhere (another seed's forecasts, I/O) leaves its link unpolled past the learner's
    peer timeout: the learner ends the session. The link must notice its own silence, say HELLO
    again, and deliver what it streams after; before this, its rows went to a session that no longer
    existed, unacknowledged, and the link went on as if connected."""
    from embodyrl.hal import runtime

    # the learner's server waits 1 s on a silent peer (set before it serves: its WELCOME tells the link)
    served = ServedCoupling(CFG, peer_timeout_s=1.0)
    try:
        path = served.export(tmp_path / "policy")  # the learner's own: rows acted under it are admitted
        link = CouplingLink(replace(CFG, learner=served.endpoint, peer_timeout_s=30.0), rank=3,
                            policy=runtime.load(path), seed=0)
        rng = np.random.default_rng(3)

        def exchange():
            link.exchange(rng.normal(size=(4, 12, 3)), {"context": np.zeros((4, 2)), "target": np.zeros((4, 12))})

        exchange()
        time.sleep(2.5)  # the learner expires the silent session
        assert served.read(lambda c: not c.server.sessions)
        for _ in range(20):
            exchange()
            time.sleep(0.05)
        link.close(flush_s=5.0)
        served.wait(lambda c: c.steps_by_rank.get(3, 0) >= 21 * 4, timeout_s=5)
    finally:
        served.close()
    # every streamed row arrived; at most the exchange that said HELLO again answered zero and streamed none
    assert served.rows()[(3, 3)] == link.stats.steps_sent >= 20 * 4 and link.stats.zero_answers <= 1
