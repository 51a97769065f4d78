"""libembodyrl_link (hal/coupling/c): a C or Fortran model rank on the coupling wire.

Real parts: the library built with CMake, the C example rank and the Fortran column model compiled
here, real ZeroMQ sockets (CurveZMQ included) to a real coupling learner (in this process or
``embodyrl learner coupling``), MPICH ranks, SIGKILL for the learner outage."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from embodyrl.hal import runtime
from embodyrl.hal.coupling import CouplingConfig, CouplingLink
from embodyrl.hal.coupling.clib import CBuildError, build, compile_program
from embodyrl.hal.wire.security import ServerKeys, generate_keys
from tests.cli_helpers import in_process

ROOT = Path(__file__).resolve().parents[1]
LEVELS, FEATURES, CONTEXT, RADIUS, BOUND = 10, 2, 1, 1, 2.0
SHAPE = f"levels={LEVELS} features={FEATURES} context={CONTEXT} radius={RADIUS} max_correction={BOUND}"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The library and the C example rank, compiled here (the Fortran model by its own test)."""
    where = tmp_path_factory.mktemp("clib")
    try:
        build(where)
    except CBuildError as err:
        pytest.skip(f"libembodyrl_link cannot be built here: {err}")
    compile_program(ROOT / "examples/c/coupling_link.c", where, where / "coupling_link",
                    flags=("-O2", "-Wall", "-Werror"))
    return where


def coupling(**kw) -> CouplingConfig:
    return CouplingConfig(levels=LEVELS, features=FEATURES, context=CONTEXT, radius=RADIUS, max_correction=BOUND, **kw)


def random_export(path: Path, seed: int = 0) -> Path:
    """A coupling policy's export (json, npz, msgpack) with random weights of the learner's shape."""
    import jax

    from embodyrl.coupling.learner import CouplingLearnerConfig, export_policy, init
    from embodyrl.hal.steps import PolicyVersion

    config = CouplingLearnerConfig().ddpg
    networks, state = init(jax.random.key(seed), coupling(), config)
    runtime.save(path, *export_policy(networks, state.actor_params, config, PolicyVersion(7, 3)), packed=True)
    return path.with_suffix(".msgpack")


def inputs(path: Path, columns: int, records: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """Records of (state, context, target) written to ``path`` as the C example reads them."""
    rng = np.random.default_rng(seed)
    out = [(rng.normal(size=(columns, LEVELS, FEATURES)).astype(np.float32),
            rng.normal(size=(columns, CONTEXT)).astype(np.float32),
            rng.normal(size=(columns, LEVELS)).astype(np.float32)) for _ in range(records)]
    np.concatenate([a.ravel() for r in out for a in r]).astype("<f4").tofile(path)
    return out


def rank(built: Path, config: str, columns: int, steps: int, data: Path, out: Path, pause_ms: int = 0, **kw):
    command = [str(built / "coupling_link"), f"{SHAPE} {config}", str(columns), str(steps), str(data), str(out),
               str(pause_ms)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def finished(proc, timeout: float = 120) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1]), err


def test_corrections_in_c_equal_the_numpy_runtime_for_the_same_export(built, tmp_path):
    policy = random_export(tmp_path / "policy")
    records = inputs(tmp_path / "in.f32", columns=13, records=3)
    # inference_rows 7: the C forward pass in blocks that split columns, as a rank's cache would want
    proc = rank(built, f"policy={policy} explore=0 inference_rows=7", 13, 3, tmp_path / "in.f32", tmp_path / "out")
    stats, _ = finished(proc)
    assert stats["zero_answers"] == 0 and stats["version"] == [7, 3]
    corrections = np.fromfile(tmp_path / "out", "<f4").reshape(3, 13, LEVELS)
    link = CouplingLink(coupling(explore=False), 0, policy=runtime.load_packed(policy))
    for (state, context, _), got in zip(records, corrections, strict=True):
        expected = link.exchange(state, {"context": context})
        assert np.abs(expected).max() > 0.05  # not a trivially zero network
        np.testing.assert_allclose(got, expected, atol=2e-6)
    assert runtime.load_packed(policy).version == runtime.load(policy).version  # the two exports agree


def test_the_packed_export_holds_the_same_policy_as_json_and_npz(tmp_path):
    policy = random_export(tmp_path / "p")
    packed, plain = runtime.load_packed(policy), runtime.load(policy)
    assert packed.graph == plain.graph and packed.arrays.keys() == plain.arrays.keys()
    for name, value in plain.arrays.items():
        np.testing.assert_array_equal(packed.arrays[name], value)
    (tmp_path / "bad.msgpack").write_bytes(b"\x93\x01")
    with pytest.raises(runtime.ExportError, match="not a packed"):
        runtime.load_packed(tmp_path / "bad.msgpack")


def serve(learner, proc, train_until: int | None = None, deadline_s: float = 120) -> None:
    """Poll (and train, up to ``train_until`` updates, then publish once more) until ``proc`` exits."""
    published_last = False
    end = time.monotonic() + deadline_s
    while proc.poll() is None and time.monotonic() < end:
        learner.poll(5)
        if train_until is None or learner.updates < train_until:
            learner.train()
        elif not published_last:
            learner.publish()
            published_last = True
    assert proc.poll() is not None, "the rank did not finish"


def test_a_c_rank_streams_to_the_learner_and_follows_its_weights(built, tmp_path):
    from embodyrl.coupling import CouplingLearner, CouplingLearnerConfig
    from embodyrl.hal.steps import PolicyVersion

    config = CouplingLearnerConfig(min_steps=50, publish_every=5, updates_per_call=5, capacity=20_000)
    learner = CouplingLearner(coupling(), config)
    learner.warm_up()
    published = {}  # every publication, so the rank's last corrections can be checked against its weights
    publish = learner.server.publish

    def recorded(version, arrays):
        published[tuple(version)] = {k: np.array(v) for k, v in arrays.items()}
        publish(version, arrays)

    learner.server.publish = recorded
    graph, _ = learner.export()
    runtime.save(tmp_path / "policy_init", *learner.export(), packed=True)
    records = inputs(tmp_path / "in.f32", columns=16, records=5)
    steps = 400
    proc = rank(built, f"policy={tmp_path / 'policy_init.msgpack'} learner={learner.endpoint} explore=0 "
                       "stream_fraction=0.5 send_every=2", 16, steps, tmp_path / "in.f32", tmp_path / "out", 5)
    session = None
    try:
        while session is None and proc.poll() is None:
            learner.poll(10)
            session = next(iter(learner.server.sessions.values()), None)
        assert session is not None and session.follower.encodings == frozenset({"full"})  # its HELLO said so
        serve(learner, proc, train_until=100)
        stats, err = finished(proc)
        learner.poll(50)
        assert learner.steps_by_rank == {0: stats["steps_sent"]} and stats["steps_sent"] == 8 * steps
        assert stats["steps_dropped"] == 0 and stats["weights_refused"] == 0, err
        assert stats["weights_taken"] >= 1 and tuple(stats["version"]) in published  # a publication, not the export
        assert set(learner.server.publisher.sent) == {"full"}
        # its last corrections come from the weights it held, as the Python link computes them
        last = np.fromfile(tmp_path / "out", "<f4").reshape(steps, 16, LEVELS)[-1]
        state, context, _ = records[(steps - 1) % len(records)]
        policy = runtime.NumpyPolicy(graph, learner.export()[1])
        policy.load_weights(PolicyVersion(*stats["version"]), published[tuple(stats["version"])])
        python = CouplingLink(coupling(explore=False), 0, policy=policy)
        np.testing.assert_allclose(last, python.exchange(state, {"context": context}), atol=2e-6)
    finally:
        proc.kill()
        learner.close()


def test_the_publisher_sends_full_weights_to_a_rank_that_takes_nothing_else():
    from embodyrl.hal.steps import PolicyVersion
    from embodyrl.hal.wire.codec import MessageError
    from embodyrl.transport.publisher import WeightPublisher, WeightsConfig
    from embodyrl.transport.server import weights_encodings

    publisher = WeightPublisher(WeightsConfig(encoding="delta"))
    base = {"actor/layers/0/kernel": np.zeros((3, 4), np.float32)}
    publisher.publish(PolicyVersion(5, 1), base)
    publisher.publish(PolicyVersion(5, 2), {"actor/layers/0/kernel": np.ones((3, 4), np.float32)})
    assert publisher.update_for(PolicyVersion(5, 1), None).encoding == "delta"
    assert publisher.update_for(PolicyVersion(5, 1), None, frozenset({"full"})).encoding == "full"
    assert weights_encodings({}) is None
    assert weights_encodings({"weights": ["full"]}) == frozenset({"full"})
    for bad in (["delta"], "full", ["full", "zip"]):
        with pytest.raises(MessageError, match="weights"):
            weights_encodings({"weights": bad})


def learner_process(tmp_path: Path, name: str, yaml_text: str) -> tuple[subprocess.Popen, dict]:
    (tmp_path / f"{name}.yaml").write_text(yaml_text)
    proc = subprocess.Popen([sys.executable, "-m", "embodyrl.cli", "learner", "coupling", "--config",
                             str(tmp_path / f"{name}.yaml"), "--run-dir", str(tmp_path / name)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, proc.stderr.read()[-3000:]
    return proc, json.loads(line)


LEARNER_YAML = (f"coupling: {{levels: {LEVELS}, features: {FEATURES}, context: {CONTEXT}, radius: {RADIUS}, "
                f"max_correction: {BOUND}}}\nlearner: {{min_steps: 50, publish_every: 5, updates_per_call: 5}}\n"
                "training: {hidden_sizes: [16, 16], batch_size: 16}\n")


def statuses(path: Path) -> list[int]:
    return [int(s) for s in path.read_text().split()] if path.exists() else []


def test_a_killed_learner_does_not_stop_the_model(built, tmp_path):
    """SIGKILL the learner mid-run: both ranks finish every step without waiting on it; the one set to
    answer zero then answers zero and says why, the other keeps its last weights."""
    learner, started = learner_process(tmp_path, "learner", LEARNER_YAML)
    inputs(tmp_path / "in.f32", columns=8, records=4)
    common = f"policy={started['policy']} learner={started['endpoint']} peer_timeout_s=1 explore=0"
    steps, pause_ms = 600, 5
    ranks = [rank(built, f"{common} rank={r} zero_when_learner_lost={1 - r}", 8, steps, tmp_path / "in.f32",
                  tmp_path / f"out{r}", pause_ms) for r in (0, 1)]
    try:
        while min(len(statuses(tmp_path / f"out{r}.status")) for r in (0, 1)) < 150:
            assert all(p.poll() is None for p in ranks), ranks[0].stderr.read()[-2000:]
            time.sleep(0.05)
        learner.send_signal(signal.SIGKILL)
        learner.wait(10)
        killed_at = [len(statuses(tmp_path / f"out{r}.status")) for r in (0, 1)]
        started_s = time.monotonic()
        results = [finished(p, timeout=60) for p in ranks]
        elapsed = time.monotonic() - started_s
    finally:
        for p in (*ranks, learner):
            p.kill()
    # every step taken at the model's pace: no wait on the dead learner beyond its own pauses
    assert elapsed < (steps - min(killed_at)) * pause_ms / 1000 + 15
    zero_rank, stale_rank = (statuses(tmp_path / f"out{r}.status") for r in (0, 1))
    assert len(zero_rank) == len(stale_rank) == steps
    # before the kill its policy answered (a learner descheduled past peer_timeout_s costs a few zeros);
    # after it, zeros once the timeout has passed
    assert zero_rank[:100].count(0) >= 90 and zero_rank[-50:] == [1] * 50
    assert stale_rank[-50:] == [0] * 50  # zero_when_learner_lost=0: the last weights go on
    corrections = np.fromfile(tmp_path / "out1", "<f4").reshape(steps, 8, LEVELS)
    assert np.abs(corrections[-1]).max() > 0
    (_, err0), (stats1, _) = results
    assert "learner silent or unreachable: zero correction" in err0
    assert stats1["zero_answers"] == 0


def test_curve_keys_admit_an_authorised_c_rank_and_nobody_else(built, tmp_path):
    from embodyrl.coupling import CouplingLearner

    keys = tmp_path / "keys"
    generate_keys(keys / "learner", "learner")
    generate_keys(keys / "authorized", "rank-0")
    generate_keys(keys / "strangers", "stranger")
    learner = CouplingLearner(coupling(), keys=ServerKeys(keys / "learner/learner.key_secret", keys / "authorized"))
    runtime.save(tmp_path / "policy", *learner.export(), packed=True)
    inputs(tmp_path / "in.f32", columns=4, records=2)
    base = (f"policy={tmp_path / 'policy.msgpack'} learner={learner.endpoint} server_key={keys}/learner/learner.key "
            "connect_timeout_s=2")
    try:
        good = rank(built, f"{base} secret_key={keys}/authorized/rank-0.key_secret", 4, 60, tmp_path / "in.f32",
                    tmp_path / "good", 5)
        stranger = rank(built, f"{base} rank=1 secret_key={keys}/strangers/stranger.key_secret", 4, 60,
                        tmp_path / "in.f32", tmp_path / "stranger", 5)
        serve(learner, stranger)
        serve(learner, good)
        (stats, _), (refused, err) = finished(good), finished(stranger)
        learner.poll(50)
        assert learner.steps_by_rank == {0: stats["steps_sent"]} and stats["steps_sent"] == 4 * 60
        assert refused["zero_answers"] == 60 and "is our key authorised there?" in err
    finally:
        learner.close()
    # plain TCP to another machine is refused before anything is sent
    plain = rank(built, f"policy={tmp_path / 'policy.msgpack'} learner=tcp://192.0.2.1:5555", 4, 1,
                 tmp_path / "in.f32", tmp_path / "plain")
    _, err = plain.communicate(timeout=30)
    assert plain.returncode == 1 and "refusing plain TCP" in err


def test_bad_input_and_configuration_are_named_and_cost_one_step(built, tmp_path):
    policy = random_export(tmp_path / "policy")
    records = inputs(tmp_path / "in.f32", columns=3, records=2)
    state, context, target = records[1]
    state[1, 2, 0] = np.nan
    np.concatenate([a.ravel() for r in records for a in r]).astype("<f4").tofile(tmp_path / "in.f32")
    stats, err = finished(rank(built, f"policy={policy} explore=0", 3, 4, tmp_path / "in.f32", tmp_path / "out"))
    assert statuses(tmp_path / "out.status") == [0, -1, 0, -1] and stats["zero_answers"] == 2
    assert "state: non-finite values" in err
    assert not np.fromfile(tmp_path / "out", "<f4").reshape(4, 3, LEVELS)[1].any()
    for config, message in ((f"policy={tmp_path / 'none.msgpack'}", "cannot open"), ("", "policy: the coupling"),
                            (f"policy={policy} max_correction=3", "bounds differ"),
                            (f"policy={policy} levels=0", "levels, features >= 1"),
                            (f"policy={policy} colour=blue", "unknown config key colour")):
        proc = rank(built, config, 3, 1, tmp_path / "in.f32", tmp_path / "x")
        _, err = proc.communicate(timeout=30)
        assert proc.returncode in (1, 2) and message in err, (config, err)


MPIFORT, MPIEXEC = shutil.which("mpifort.mpich"), shutil.which("mpiexec.mpich")


@pytest.fixture(scope="module")
def fortran_model(built) -> Path:
    if MPIFORT is None or MPIEXEC is None or not (built / "embodyrl_link.mod").exists():
        pytest.skip("Debian's mpich and gfortran are needed (bash .ci/setup installs them)")
    return compile_program(ROOT / "examples/fortran/column_model.f90", built, built / "column_model", MPIFORT)


def mpi_model(binary: Path, steps: int, out: Path, config: str, step_ms: int = 0) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([MPIEXEC, "-n", "4", str(binary), str(steps), "64", str(out), config, str(step_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_the_fortran_model_trains_under_mpi_survives_its_learner_and_matches_python(fortran_model, tmp_path):
    yaml_text = (ROOT / "examples/fortran/column_model.yaml").read_text()
    # 1. four ranks stream to the learner and follow its weights
    learner, started = learner_process(tmp_path, "learner", yaml_text)
    model = mpi_model(fortran_model, 400, tmp_path / "train", f"policy={started['policy']} "
                      f"learner={started['endpoint']} stream_fraction=0.5 send_every=4", step_ms=5)
    out, err = model.communicate(timeout=300)
    assert model.returncode == 0, err[-3000:]
    learner.send_signal(signal.SIGINT)
    counters = json.loads(learner.communicate(timeout=60)[0].strip().splitlines()[-1])
    assert counters["steps_by_rank"] == {str(r): 400 * 8 for r in range(4)} and counters["updates"] > 0
    curve = [json.loads(line) for line in (tmp_path / "learner" / "metrics.jsonl").read_text().splitlines()]
    assert curve[-1]["updates"] == counters["updates"] and "critic_loss" in curve[-1]  # its learning curve
    assert "zero answers on rank 0 0" in out.strip().splitlines()[-1]
    # 2. its corrections equal the Python link's for the same weights and inputs (frozen, no noise)
    trained = tmp_path / "learner" / "policy.msgpack"
    model = mpi_model(fortran_model, 3, tmp_path / "frozen", f"policy={trained} explore=0")
    assert model.wait(120) == 0, model.stderr.read()[-3000:]
    shape = CouplingConfig(levels=20, features=2, context=1, radius=1, max_correction=5.0, explore=False)
    python = CouplingLink(shape, 0, policy=runtime.load_packed(trained))
    for r in range(4):
        dump = np.fromfile(tmp_path / "frozen" / f"rank{r}.f32", "<f4")
        state, rest = dump[:16 * 20 * 2].reshape(16, 20, 2), dump[16 * 20 * 2:]
        context, correction = rest[:16].reshape(16, 1), rest[16:].reshape(16, 20)
        expected = python.exchange(state, {"context": context})
        assert np.abs(expected).max() > 0.05
        np.testing.assert_allclose(correction, expected, atol=2e-5)
    # 3. a learner killed mid-run does not stop the model
    learner, started = learner_process(tmp_path, "doomed", yaml_text)
    model = mpi_model(fortran_model, 800, tmp_path / "outage", f"policy={started['policy']} "
                      f"learner={started['endpoint']} peer_timeout_s=0.5", step_ms=5)
    time.sleep(2.0)
    learner.send_signal(signal.SIGKILL)
    learner.wait(10)
    out, err = model.communicate(timeout=120)
    assert model.returncode == 0, err[-3000:]
    assert "step 800 " in out and "learner silent or unreachable" in err


def test_the_c_against_python_benchmark_reports_both_links_on_the_same_rows(built):
    from embodyrl.bench import run

    res = run("coupling_c", quick=True)
    for key in ("python_link_us_per_column_step", "c_link_us_per_column_step", "python_inference_us_per_column_step",
                "c_inference_us_per_column_step", "python_over_c_link", "python_over_c_inference"):
        assert np.isfinite(res[key]) and res[key] > 0, key
    streamed = -(-res["exchanges"] // res["stream_every"]) * round(res["stream_fraction"] * res["columns"])
    assert res["python_steps_sent"] == res["c_steps_sent"] == streamed and res["zero_answers"] == 0
    assert res["steps_acknowledged"] == 2 * res["turns"] * streamed  # the learner took every row of both


def test_an_unreachable_learner_spools_then_drops_as_configured(built, tmp_path):
    """No learner at all: the rank acts on its export's weights (zero_when_learner_lost=0), keeps its
    steps in a spool of spool_bytes, then drops the oldest or the newest and says so."""
    policy = random_export(tmp_path / "policy")
    inputs(tmp_path / "in.f32", columns=8, records=2)
    nobody = "tcp://127.0.0.1:9"  # the discard port: nothing answers
    for which in ("drop_oldest", "drop_newest"):
        stats, err = finished(rank(built, f"policy={policy} learner={nobody} connect_timeout_s=0.2 "
                                          f"zero_when_learner_lost=0 spool_bytes=40000 on_spool_full={which}",
                                   8, 50, tmp_path / "in.f32", tmp_path / which), timeout=60)
        assert stats["zero_answers"] == 0 and statuses(tmp_path / f"{which}.status") == [0] * 50
        assert 0 < stats["steps_dropped"] < 8 * 50 and "no WELCOME from" in err
        assert "spool full (40000 bytes)" in err and ("the oldest" if which == "drop_oldest" else "the newest") in err


def test_a_second_rank_with_the_same_index_is_refused_by_name(built, tmp_path):
    from embodyrl.coupling import CouplingLearner

    learner = CouplingLearner(coupling())
    runtime.save(tmp_path / "policy", *learner.export(), packed=True)
    inputs(tmp_path / "in.f32", columns=4, records=2)
    config = f"policy={tmp_path / 'policy.msgpack'} learner={learner.endpoint} rank=5 connect_timeout_s=3"
    try:
        first = rank(built, config, 4, 300, tmp_path / "in.f32", tmp_path / "first", 10)
        while not learner.server.sessions and first.poll() is None:
            learner.poll(10)
        second = rank(built, config, 4, 5, tmp_path / "in.f32", tmp_path / "second")
        serve(learner, second)
        _, err = finished(second)
        assert "refused us: actor index 5 is in use" in err
        serve(learner, first)
        assert finished(first)[0]["zero_answers"] == 0
    finally:
        learner.close()


def test_a_hostile_learner_costs_the_rank_nothing_but_refusals(built, tmp_path):
    """A ROUTER that welcomes the rank, then sends garbage: malformed headers, frames that disagree
    with their header, absurd shapes, weights with a wrong checksum or shape, a delta it never asked
    for. The rank refuses each by name, keeps its weights and finishes every step."""
    import msgpack
    import zmq

    from embodyrl.hal.wire.codec import encode
    from embodyrl.hal.wire.weights import checksum

    policy = random_export(tmp_path / "policy")
    good = runtime.load_packed(policy)
    inputs(tmp_path / "in.f32", columns=4, records=2)
    router = zmq.Context.instance().socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    proc = rank(built, f"policy={policy} learner=tcp://127.0.0.1:{port} explore=0", 4, 300, tmp_path / "in.f32",
                tmp_path / "out", 5)
    kernel = good.arrays["actor/layers/0/kernel"]
    wrong = {"actor/layers/0/kernel": np.zeros_like(kernel)}
    attacks = [
        [b"\xc1\xc1 not msgpack"],
        [msgpack.packb({"p": 2, "k": "ACK"})],  # no f, no a
        [msgpack.packb({"p": 9, "k": "ACK", "f": {}, "a": []})],
        [msgpack.packb({"p": 2, "k": "WEIGHTS", "f": {}, "a": [["x", "float32", [1 << 40]]]}), b"1234"],
        [msgpack.packb({"p": 2, "k": "WEIGHTS", "f": {}, "a": [["x", "float32", [4]]]})],  # frame missing
        encode("ACK", {"seq": "one", "credits": []}),
        encode("WEIGHTS", {"version": [1, 1], "encoding": "full", "checksum": "0" * 32}, wrong),
        encode("WEIGHTS", {"version": [1, 2], "encoding": "full", "checksum": checksum(wrong)}, wrong),
        encode("WEIGHTS", {"version": [1, 3], "encoding": "delta", "checksum": checksum(wrong)}, wrong),
    ]
    sent = 0
    try:
        while proc.poll() is None:
            if router.poll(20):
                frames = router.recv_multipart()
                identity, header = frames[0], msgpack.unpackb(frames[1])
                if header["k"] == "HELLO":
                    router.send_multipart([identity, *encode("WELCOME", {
                        "protocol": 2, "run_id": "hostile", "incarnation": 1, "credits": 1 << 20,
                        "committed_seq": 0, "peer_timeout_s": 30.0})])
                elif sent < len(attacks):
                    router.send_multipart([identity, *attacks[sent]])
                    sent += 1
        stats, err = finished(proc)
    finally:
        proc.kill()
        router.close(linger=0)
    assert sent == len(attacks) and len(statuses(tmp_path / "out.status")) == 300
    assert stats["weights_taken"] == 0 and stats["weights_refused"] == 3 and stats["version"] == [7, 3]
    # each kind of trouble is said the first time (and every 100th): the first malformed message, the first
    # refused weights
    assert "message from the learner refused: header is not msgpack" in err
    assert "weights refused: checksum mismatch" in err
    corrections = np.fromfile(tmp_path / "out", "<f4").reshape(300, 4, LEVELS)
    state, context, _ = inputs(tmp_path / "again.f32", columns=4, records=2)[299 % 2]
    expected = CouplingLink(coupling(explore=False), 0, policy=good).exchange(state, {"context": context})
    np.testing.assert_allclose(corrections[-1], expected, atol=2e-6)  # still the export's weights


@pytest.mark.parametrize(("text", "message"), [
    (None, "--config FILE.yaml is required"),
    ("coupling: {levels: 3}\n", "levels and features are required"),
    ("coupling: {levels: 3, features: 1}\nlearner: {colour: 1}\n", "learner: unknown fields ['colour']"),
    ("coupling: {levels: 3, features: 1}\nreplay: {}\n", "unknown sections ['replay']"),
])
def test_learner_coupling_refuses_a_bad_configuration_by_name(tmp_path, text, message):
    command = ["learner", "coupling", "--run-dir", tmp_path / "run"]
    if text is not None:
        (tmp_path / "c.yaml").write_text(text)
        command += ["--config", tmp_path / "c.yaml"]
    done = in_process(*command)
    assert done.returncode == 2 and message in done.stderr and not (tmp_path / "run").exists()
