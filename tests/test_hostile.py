"""Hostile traffic at a live server: refused and counted, while an honest actor keeps streaming."""

import multiprocessing as mp
import time

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embodyrl import envs
from embodyrl.bench import chaos_hostile, chaos_link
from embodyrl.bench.chaos_parts import ledger_actor
from embodyrl.hal.ledger import ledger_totals
from embodyrl.hal.steps import rows_digest
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.codec import PROTOCOL_VERSION, encode
from embodyrl.learner.testing import ServedLearner
from embodyrl.transport import LearnerServer

descriptor = st.lists(st.one_of(st.text(max_size=4), st.integers(-3, 2**40), st.none(),
                                st.lists(st.integers(-2, 2**33), max_size=10)), max_size=5)
header = st.fixed_dictionaries({
    "p": st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION + 1]),
    "k": st.sampled_from([P.HELLO, P.STEPS, P.HEARTBEAT, P.BYE, "NOPE"]),
    "f": st.dictionaries(st.sampled_from(["seq", "device_id", "held", "actor", "actor_id", "devices", "x"]),
                         st.one_of(st.integers(-5, 2**62), st.text(max_size=5), st.lists(st.integers(-2**63, 2**63 - 1), max_size=3),
                                   st.none(), st.floats(allow_nan=True)), max_size=6),
    "a": st.lists(descriptor, max_size=4),
})
message = st.tuples(header, st.lists(st.binary(max_size=300), max_size=4))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message)
def test_generated_malformed_messages_never_break_the_server(msg):
    server = _shared_server()
    attacker = _shared_attacker(server)
    head, frames = msg
    attacker.send_multipart([msgpack.packb(head), *frames])
    before = server.stats.messages_in
    deadline = time.monotonic() + 2
    while server.stats.messages_in == before and time.monotonic() < deadline:
        for batch in server.poll(10):
            assert batch.steps.actor_id[0] == batch.session.actor_id  # only validated steps come out
    assert server.stats.messages_in == before + 1


_state = {}


def _shared_server():
    if "server" not in _state:
        _state["server"] = LearnerServer(run_id="fuzz", incarnation=1)
    return _state["server"]


def _shared_attacker(server):
    if "attacker" not in _state:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(server.endpoint)
        _state["attacker"] = sock
    return _state["attacker"]


def teardown_module():
    if "attacker" in _state:
        _state["attacker"].close(0)
    if "server" in _state:
        _state["server"].close()


def attack_frames(rng, spec_steps):
    """A mix of what a hostile peer sends: bytes, truncations, huge sizes, NaN steps, replays."""
    yield [rng.bytes(rng.integers(1, 200))]
    yield [msgpack.packb({"p": PROTOCOL_VERSION, "k": P.STEPS, "f": {"seq": 1}, "a": [["x", "float32", [1 << 30]]]}),
           b"\x00" * 16]
    yield encode(P.STEPS, {"seq": 5, "device_id": 0, "held": [0, -1]}, {"x": np.zeros(3)})[:1]
    yield encode(P.HELLO, {"actor": "evil", "actor_id": 9, "devices": [{"name": 1}], "held": [0, -1]})
    arrays = dict(spec_steps)
    arrays["observation/orientation"] = np.full_like(arrays["observation/orientation"], np.nan)
    yield encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [0, -1]}, arrays)


def test_honest_actor_keeps_streaming_under_attack(tmp_path):
    from embodyrl.hal.steps import PolicyVersion, StepRecorder

    device, _ = envs.make("pendulum")
    rec = StepRecorder(device.observation_spec, device.action_spec, actor_id=0, device_id=0)
    with device:
        obs = device.reset(seed=0)
        for _ in range(4):
            rec.add(obs, np.zeros(1, np.float32), np.zeros(1, np.float32), 0.0, False, False, PolicyVersion(1, 1))
    template = rec.flush().arrays()
    learner = ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="r", incarnation=1,
                            peer_timeout_s=10)
    ledger = tmp_path / "ledger.jsonl"
    ctx = mp.get_context("spawn")
    honest = ctx.Process(target=ledger_actor, args=(learner.endpoint, 1, str(tmp_path / "spool"), str(ledger), 2000),
                         kwargs={"peer_timeout_s": 10.0})
    honest.start()
    attacker = zmq.Context.instance().socket(zmq.DEALER)
    attacker.setsockopt(zmq.LINGER, 0)
    attacker.connect(learner.endpoint)
    rng = np.random.default_rng(0)
    attacks = 0
    try:
        deadline = time.monotonic() + 120
        while honest.is_alive() and time.monotonic() < deadline:
            for frames in attack_frames(rng, template):
                attacker.send_multipart(frames)
                attacks += 1
            time.sleep(0.005)
        honest.join(10)
        learner.wait(lambda service: sum(service.server.stats.rejected.values()) >= attacks - 5, timeout_s=10)
        rejected = learner.read(lambda service: dict(service.server.stats.rejected))
        sessions = learner.read(lambda service: [s.actor_id for s in service.server.sessions.values()])
    finally:
        if honest.is_alive():
            honest.kill()
        attacker.close(0)
        learner.close()
    assert honest.exitcode == 0
    rows = sum(len(t.steps) for t in learner.taken)
    digest = sum(rows_digest(t.steps) for t in learner.taken) % (1 << 64)
    assert (rows, digest) == ledger_totals(ledger)  # every row the link took, taken once
    assert sum(rejected.values()) >= attacks - 5  # every attack refused (the last few may be in flight)
    assert {"header_malformed", "frame_size", "frame_count"} <= set(rejected)
    assert all(actor_id == 1 for actor_id in sessions)


def test_attackers_in_their_own_processes_are_refused_by_reason_and_the_honest_actor_loses_nothing():
    record = chaos_link.hostile(True, pairs=1, window_s=0.5)
    assert record["lost"] == record["duplicated"] == 0 and record["digest_match"], record
    assert record["produced"] == record["stored"] > 0
    for name, reason in chaos_hostile.REFUSED_AS.items():
        probe = record["probes"][name]
        assert probe["sent"] > 0, name
        if reason is not None:  # each attack class counted under its reason
            assert probe["refused"].get(reason, 0) > 0, (name, probe)
    assert record["honest_index_kept"]
    assert record["bomb_rss_growth_mb"] < 64  # bounded by the limits, not by the 1 GiB the bombs declare
    assert record["honest_ratio_under_attack"] > 0 and record["hostile_reject_cpu_us_median"] is not None


# -- values bounded, an index kept: what one valid session could do to training ------------------

POISON_ROW = 17


def _session(learner, actor_id: int):
    """A raw DEALER with a session for ``actor_id`` (its WELCOME read), as an attacker's own."""
    from embodyrl.hal.wire.codec import decode

    device, _ = envs.make("pendulum")
    info = P.DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(learner.endpoint)
    sock.send_multipart(encode(P.HELLO, {"actor": "x", "actor_id": actor_id, "devices": [info.to_msg()],
                                         "held": [0, -1], "protocol": PROTOCOL_VERSION, "instance": "raw"},
                               protocol=P.HELLO_PROTOCOL))
    assert sock.poll(10_000), "no answer to HELLO"
    assert decode(sock.recv_multipart()).kind == P.WELCOME
    return sock


def _batch(actor_id: int, rows: int = 32):
    """``rows`` honest pendulum rows of ``actor_id``, flat as on the wire (acted before any weights)."""
    from embodyrl.hal.steps import NO_POLICY, StepRecorder

    device, task = envs.make("pendulum")
    rec = StepRecorder(device.observation_spec, device.action_spec, actor_id=actor_id, device_id=0, capacity=rows)
    with device:
        obs = device.reset(seed=0)
        for _ in range(rows):
            action = np.asarray([0.5], np.float32)
            next_obs = device.step(action)
            rec.add(obs, action, action, task.reward(obs, action, next_obs), False, False, NO_POLICY)
            obs = next_obs
    return {k: v.copy() for k, v in rec.flush().arrays().items()}


def _poisoned(column: str, value) -> dict:
    arrays = _batch(4)
    arrays[column][POISON_ROW] = value
    if column == "policy_incarnation":
        arrays["policy_count"][POISON_ROW] = 1
    return arrays


@pytest.mark.parametrize("column, value, shown, reason", [
    ("reward", 3e38, "3e+38", "steps_invalid"),
    ("proposed_action", 1e30, "1e+30", "steps_invalid"),
    ("step_index", -7, "-7", "steps_invalid"),
    ("policy_incarnation", 2**62, str(2**62), "unknown_incarnation"),
])
def test_one_absurd_value_refuses_the_batch_naming_column_row_and_value_and_nothing_is_stored(
        tmp_path, column, value, shown, reason):
    learner = ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="r", incarnation=5)
    sock = _session(learner, 4)
    try:
        sock.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [0, -1]}, _poisoned(column, value)))
        sock.send_multipart(encode(P.STEPS, {"seq": 2, "device_id": 0, "held": [0, -1]}, _batch(4)))
        assert learner.wait(lambda s: s.counters.rows >= 32 or s.server.stats.messages_in >= 4)
        assert learner.wait(lambda s: s.data.committed_seq(4) == 2)
        stored = learner.read(lambda s: s.data.replay.size)
        said = learner.read(lambda s: s.server.stats.last_refusal.get(reason, ""))
    finally:
        sock.close(0)
        learner.close()
    assert [t.seq for t in learner.taken] == [2] and stored == 32  # the poisoned batch never reached the replay
    assert learner.server.stats.rejected.get(reason) == 1
    assert column in said and f"row {POISON_ROW}" in said and shown in said, said


def test_a_quiet_actors_index_is_not_taken_by_a_fresh_socket_and_the_actor_streams_on(tmp_path):
    from embodyrl.hal.steps import Steps
    from embodyrl.hal.wire.client import LearnerLink
    from embodyrl.hal.wire.codec import decode

    layout = envs.layout("pendulum")
    learner = ServedLearner(tmp_path / "learner", layout, run_id="r", incarnation=5)  # the default window
    info = P.DeviceInfo(0, "pendulum", layout.observation_spec, layout.action_spec)
    honest = LearnerLink(learner.endpoint, actor_name="honest", actor_id=0, devices=[info], handshake_timeout_s=10)
    attacker = zmq.Context.instance().socket(zmq.DEALER)
    attacker.setsockopt(zmq.LINGER, 0)
    attacker.connect(learner.endpoint)
    batch = Steps.from_arrays(_batch(0), layout.observation_spec, layout.action_spec)
    try:
        honest.connect()
        honest.send_steps(0, batch)
        assert honest.flush(10) and honest.acked_seq == 1
        time.sleep(1.8)  # the actor is busy (a slow step, a credit wait): silent for less than 3 heartbeats
        attacker.send_multipart(encode(P.HELLO, {"actor": "evil", "actor_id": 0, "devices": [info.to_msg()],
                                                 "held": [0, -1], "protocol": PROTOCOL_VERSION,
                                                 "instance": "evil"}, protocol=P.HELLO_PROTOCOL))
        assert attacker.poll(10_000)
        reply = decode(attacker.recv_multipart())
        attacker.send_multipart(encode(P.STEPS, {"seq": 10**12, "device_id": 0, "held": [0, -1]}, _batch(0)))
        honest.send_steps(0, batch)  # the honest actor wakes up and streams on
        assert honest.flush(10) and honest.acked_seq == 2
        owners = learner.read(lambda s: [x.instance for x in s.server.sessions.values()])
    finally:
        honest.close()
        attacker.close(0)
        learner.close()
    assert reply.kind == P.REFUSED and "actor index 0" in reply.fields["reason"], reply.fields
    assert reply.fields.get("retry") is True
    assert owners == [honest.instance]
    assert [t.seq for t in learner.taken] == [1, 2]


def test_a_seq_absurdly_far_ahead_is_refused_by_name_and_never_acknowledged(tmp_path):
    learner = ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="r", incarnation=5)
    sock = _session(learner, 6)
    try:
        sock.send_multipart(encode(P.STEPS, {"seq": 10**12, "device_id": 0, "held": [0, -1]}, _batch(6)))
        sock.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [0, -1]}, _batch(6)))
        assert learner.wait(lambda s: s.data.committed_seq(6) >= 1 or s.server.stats.messages_in >= 3)
        assert learner.wait(lambda s: s.data.committed_seq(6) >= 1)
        committed = learner.read(lambda s: s.data.committed_seq(6))
        said = learner.read(lambda s: s.server.stats.last_refusal.get("seq_jump", ""))
    finally:
        sock.close(0)
        learner.close()
    assert committed == 1 and [t.seq for t in learner.taken] == [1]
    assert learner.server.stats.rejected.get("seq_jump") == 1
    assert str(10**12) in said, said
