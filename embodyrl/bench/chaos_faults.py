"""Chaos scenarios beside the link: disk full under the replay; bad config, and bad device data
and actions injected into a running learner server and a running robot server.

Each returns the same record as the link scenarios (``name``, ``injected``,
``produced``, ``stored``, ``lost``, ``duplicated``, ``recovery_s``) plus what
it checked.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import subprocess
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np


def _stream(first: int, count: int, actor_id: int = 0):
    """Deterministic rows: row g holds x = g; episodes of 11 rows, the last one final."""
    from embodyrl.hal.steps import Steps

    g = np.arange(first, first + count, dtype=np.int64)
    step = (g % 11).astype(np.int32)
    final = step == 10
    return Steps(observation={"x": np.stack([g, -g], axis=1).astype(np.float32)},
                 action=np.zeros((count, 1), np.float32), proposed_action=np.zeros((count, 1), np.float32),
                 log_prob=np.zeros(count, np.float32), reward=np.ones(count, np.float32),
                 terminated=np.zeros(count, bool), truncated=step == 9, final=final,
                 episode_id=g // 11, step_index=step, device_id=np.zeros(count, np.int32),
                 actor_id=np.full(count, actor_id, np.int32), policy_incarnation=np.ones(count, np.int64),
                 policy_count=np.zeros(count, np.int64), source=np.zeros(count, np.uint8))


def _specs():
    from embodyrl.hal.specs import ArraySpec, DictSpec

    return DictSpec.of(ArraySpec("x", (2,), np.float32)), ArraySpec("action", (1,), np.float32, -1, 1)


def _disk_full_writer(directory: str, filler: str, result_path: str, capacity: int) -> None:
    """Create a replay, fill the rest of the disk, then add and commit until the disk refuses."""
    from embodyrl.replay import PersistentReplay

    obs, act = _specs()
    out = {"committed": 0, "added": 0, "error": None}
    replay = PersistentReplay(directory, obs, act, capacity=capacity, chunk_rows=64)
    g = 0
    for _ in range(10):  # some rows are durable before the disk fills
        replay.add(_stream(g, 50), seq=g + 50)
        g += 50
        replay.commit()
    out["committed"] = out["added"] = replay.rows_added
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)  # take every free byte left
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    os.close(fd)
    try:
        for actor in range(1, 2000):  # a new actor each batch: the index grows until it needs a new page
            replay.add(_stream(g, 50, actor), seq=g + 50)
            g += 50
            out["added"] = g
            replay.commit()
            out["committed"] = replay.rows_added
    except OSError as err:
        frame = traceback.extract_tb(err.__traceback__)[-1]
        out["error"] = f"{type(err).__name__}: {err}"
        out["raised_at"] = f"{Path(frame.filename).name}:{frame.lineno} {frame.line}"
    Path(result_path).write_text(json.dumps(out))
    os._exit(0)  # the buffer is left as a crash would leave it


def _reopen_check(directory: str) -> dict:
    from embodyrl.replay import PersistentReplay

    replay = PersistentReplay(directory)
    try:
        ring = replay.store.ring
        chunks = [c for c in np.argsort(ring.generation) if ring.generation[c] >= 0]
        slots = np.concatenate([np.arange(c * ring.chunk_rows, c * ring.chunk_rows + ring.fill[c]) for c in chunks]
                               ) if chunks else np.empty(0, np.int64)
        x = replay.store.rows["observation/x"][slots, 0].astype(np.int64)
        rows_added = replay.rows_added
        consistent = bool(np.array_equal(x, np.arange(rows_added - len(x), rows_added)))
        return {"rows_added": int(rows_added), "stored": int(len(x)), "unique": int(len(np.unique(x))),
                "consistent": consistent}
    finally:
        replay.close(commit=False)


def disk_full(quick: bool) -> dict:
    """The replay's disk fills up: a clear error, and the buffer reopens as a consistent prefix."""
    record = {"name": "disk_full", "injected": 0, "produced": 0, "stored": 0, "lost": 0, "duplicated": 0,
              "recovery_s": 0.0}
    trials = 1 if quick else 3
    details = []
    for trial in range(trials):
        mount = Path(tempfile.mkdtemp(prefix="chaos-tmpfs-"))
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            mount.rmdir()
            record["skipped"] = f"cannot mount a tmpfs (needs root): {done.stderr.strip()}"
            return record
        try:
            too_big = _too_big_error(mount)
            result = Path(tempfile.mkdtemp(prefix="chaos-result-")) / "result.json"  # off the full disk
            ctx = mp.get_context("spawn")
            writer = ctx.Process(target=_disk_full_writer,
                                 args=(str(mount / "replay"), str(mount / "filler"), str(result),
                                       4096 * (trial + 1)))
            writer.start()
            writer.join(120)
            if writer.is_alive():
                writer.kill()
                writer.join()
            out = json.loads(result.read_text()) if result.exists() else {}
            shutil.rmtree(result.parent, ignore_errors=True)
            (mount / "filler").unlink(missing_ok=True)  # free room, as an operator would
            start = time.monotonic()
            try:
                check = _reopen_check(str(mount / "replay"))
            except ValueError as err:  # the buffer did not survive: every committed row is lost
                check = {"rows_added": 0, "stored": 0, "unique": 0, "consistent": False, "reopen_error": str(err)}
            recovery = time.monotonic() - start
        finally:
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)
            mount.rmdir()
        details.append({"writer_exit": writer.exitcode, "error": out.get("error"), "too_big_error": too_big,
                        "raised_at": out.get("raised_at"), "rows_added_before_error": out.get("added"),
                        **check})
        record["injected"] += 1
        record["produced"] += out.get("committed", 0)  # rows the writer was told were durable
        record["stored"] += check["rows_added"]
        record["lost"] += max(0, out.get("committed", 0) - check["rows_added"])
        record["duplicated"] += check["stored"] - check["unique"]
        record["recovery_s"] = max(record["recovery_s"], recovery)
    record["clear_errors"] = sum(1 for d in details if d["error"] and ("disk full" in d["error"] or "No space" in d["error"]))
    record["consistent"] = all(d["consistent"] for d in details)
    record["trials"] = details
    return record


def _too_big_error(mount: Path) -> str | None:
    """A replay larger than the disk must fail at creation with a message saying how much."""
    from embodyrl.replay import PersistentReplay

    obs, act = _specs()
    try:
        PersistentReplay(mount / "huge", obs, act, capacity=1 << 20, chunk_rows=4096).close()
    except OSError as err:
        return str(err)
    finally:
        subprocess.run(["rm", "-rf", str(mount / "huge")], capture_output=True)
    return None


def _config_cases() -> tuple[int, int, int, list[str]]:
    """Bad config values through the path every command reads its config by: (cases, refused,
    refused naming the field, messages)."""
    from embodyrl.algos import registry
    from embodyrl.config import TrainConfig, from_dict, to_dict

    section = registry.get(TrainConfig().algorithm).section  # the default algorithm's settings
    cases = [({"stpes": 3}, "stpes"), ({section: {"lr": 1.0}}, f"{section}.lr"),
             ({"algorithm": "a2c"}, "algorithm"), ({"steps": "many"}, "steps"),
             ({section: {"hidden_sizes": 64}}, f"{section}.hidden_sizes"),
             ({section: {"discount": "high"}}, f"{section}.discount")]
    errors, clear, messages = 0, 0, []
    for change, field in cases:
        data = to_dict(TrainConfig())
        for key, value in change.items():
            if isinstance(value, dict):
                data[key].update(value)
            else:
                data[key] = value
        try:
            from_dict(TrainConfig, data)
        except (ValueError, TypeError) as err:
            errors += 1
            clear += field in str(err)
            messages.append(str(err))
    return len(cases), errors, clear, messages


FAULTY_SEEDS = {1001: "nan", 1002: "shape", 1003: "missing"}
"""RESET seeds on which :class:`FaultyPendulum` reports a bad observation."""


def faulty_pendulum():
    """Robot server factory (``embodyrl.bench.chaos_faults:faulty_pendulum``): the pendulum, whose
    sensors misreport on the RESET seeds of :data:`FAULTY_SEEDS` (bad device data)."""
    from embodyrl import envs
    from embodyrl.hal.robot_server import DeviceDriver

    class FaultyPendulum(DeviceDriver):
        def reset(self, seed):
            observation = dict(super().reset(seed))
            fault, key = FAULTY_SEEDS.get(seed), next(iter(observation))
            if fault == "nan":
                observation[key] = np.full_like(observation[key], np.nan)
            elif fault == "shape":
                observation[key] = np.zeros(np.shape(observation[key]) + (2,), np.asarray(observation[key]).dtype)
            elif fault == "missing":
                del observation[key]
            return observation

    return FaultyPendulum(envs.make("pendulum")[0])


def serve_learner(endpoint_queue, stop, results) -> None:
    """Process target: a learner server that acknowledges every valid batch until ``stop``; then
    puts its counters (refused by reason, messages, batches taken) on ``results``."""
    from embodyrl.transport import LearnerServer

    server = LearnerServer("tcp://127.0.0.1:*", run_id="bad-input", incarnation=1)
    endpoint_queue.put(server.endpoint)
    taken = 0
    try:
        while not stop.is_set():
            for batch in server.poll(20):
                taken += 1
                server.ack(batch.session, batch.seq, credits=len(batch.steps))
    finally:
        results.put({"rejected": dict(server.stats.rejected), "messages_in": server.stats.messages_in,
                     "taken": taken})
        server.close()


def _request(sock, kind: str, fields: dict, arrays=None, timeout_s: float = 10.0):
    """Send one request and wait for its reply (decoded), or None."""
    import zmq

    from embodyrl.hal.wire.codec import decode, encode

    sock.send_multipart(encode(kind, fields, arrays))
    if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
        return None
    return decode(sock.recv_multipart())


def _learner_injection(endpoint: str) -> tuple[int, bool, list[str]]:
    """Bad device data (rows) into a running learner server from an actor with a session:
    (injected, a valid batch acknowledged after them, what was injected)."""
    import zmq

    from embodyrl.hal.wire import protocol as P
    from embodyrl.hal.wire.codec import decode, encode

    from .chaos_hostile import Rows, hello_frames

    rows, actor = Rows(7), 7
    good = rows.arrays
    cases = []
    for key in [k for k in good if k.startswith("observation/")]:
        column = good[key]
        cases += [(f"{key}: nan", {**good, key: np.full_like(column, np.nan)}),
                  (f"{key}: shape", {**good, key: np.zeros(column.shape + (2,), column.dtype)}),
                  (f"{key}: missing", {k: v for k, v in good.items() if k != key})]
    cases += [("action: nan", {**good, "action": np.full_like(good["action"], np.nan)}),
              ("action: shape", {**good, "action": np.zeros((len(good["action"]), 3), good["action"].dtype)})]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(hello_frames(rows.info, actor, "bad-input"))
        welcome = decode(sock.recv_multipart()) if sock.poll(30000, zmq.POLLIN) else None
        if welcome is None or welcome.kind != P.WELCOME:
            raise RuntimeError(f"the learner server did not welcome the injector: {welcome}")
        for _, arrays in cases:
            sock.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [0, -1]}, arrays))
        sock.send_multipart(encode(P.STEPS, {"seq": 1, "device_id": 0, "held": [0, -1]}, good))
        deadline, acked = time.monotonic() + 30, False
        while not acked and time.monotonic() < deadline and sock.poll(1000, zmq.POLLIN):
            msg = decode(sock.recv_multipart())
            acked = msg.kind == P.ACK and msg.fields["seq"] >= 1
    finally:
        sock.close(0)
    return len(cases), acked, [name for name, _ in cases]


def _robot_injection(endpoint: str) -> tuple[int, int, bool, list[str], dict]:
    """Bad actions and bad device data into a running robot server:
    (injected, refused naming the field, still serving afterwards, messages, STATUS counters)."""
    import zmq

    from embodyrl.hal import robot_server as R

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    seq, refused, clear, messages = iter(range(1, 10**6)), 0, 0, []
    try:
        specs = _request(sock, R.HELLO, {"seq": next(seq)}, timeout_s=30)
        if specs is None or specs.kind != R.SPECS:
            raise RuntimeError(f"the robot server did not answer HELLO: {specs}")
        fields = [spec["name"] for spec in specs.fields["observation_spec"]]
        _request(sock, R.RESET, {"seq": next(seq), "seed": 0})
        action_cases = [("action", np.array([np.nan], np.float32)), ("action", np.zeros(3, np.float32)),
                        ("action", np.array([1e3], np.float32)), ("action", None)]
        for field, action in action_cases:
            reply = _request(sock, R.STEP, {"seq": next(seq)}, None if action is None else {"action": action})
            refused += reply is not None and reply.kind == R.ERROR
            clear += reply is not None and field in str(reply.fields.get("detail", ""))
            messages.append(f"{reply.fields.get('reason')}: {reply.fields.get('detail')}" if reply else "no reply")
        for seed in FAULTY_SEEDS:  # the device misreports: the server refuses to pass it on
            reply = _request(sock, R.RESET, {"seq": next(seq), "seed": seed})
            detail = str(reply.fields.get("detail", "")) if reply is not None else ""
            refused += reply is not None and reply.kind == R.ERROR
            clear += any(field in detail for field in fields)
            messages.append(f"{reply.fields.get('reason')}: {reply.fields.get('detail')}" if reply else "no reply")
        obs = _request(sock, R.RESET, {"seq": next(seq), "seed": 0})
        step = _request(sock, R.STEP, {"seq": next(seq)}, {"action": np.zeros(1, np.float32)})
        serving = obs is not None and obs.kind == R.OBS and step is not None and step.kind == R.OBS
        status = _request(sock, R.STATUS, {"seq": next(seq)})
        _request(sock, R.BYE, {"seq": next(seq)})
    finally:
        sock.close(0)
    return len(action_cases) + len(FAULTY_SEEDS), refused, clear, serving, messages, \
        dict(status.fields.get("rejected", {})) if status is not None else {}


def bad_input(quick: bool) -> dict:
    """Bad config values, and bad device data and actions injected over real sockets into a running
    learner server and a running robot server: each refused and counted by reason, each process
    still serving afterwards (a valid batch acknowledged, a valid RESET and STEP answered)."""
    from embodyrl.hal.robot_server import serve_process

    ctx = mp.get_context("spawn")
    stop, results, learner_at, robot_at = ctx.Event(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    learner = ctx.Process(target=serve_learner, args=(learner_at, stop, results))
    robot = ctx.Process(target=serve_process, args=("embodyrl.bench.chaos_faults:faulty_pendulum",
                                                    "tcp://127.0.0.1:*", robot_at))
    learner.start()
    robot.start()
    try:
        n_config, config_errors, config_clear, messages = _config_cases()
        n_rows, acked, row_cases = _learner_injection(learner_at.get(timeout=120))
        n_robot, robot_refused, robot_clear, robot_serving, robot_messages, robot_rejected = \
            _robot_injection(robot_at.get(timeout=120))
        learner_alive, robot_alive = learner.is_alive(), robot.is_alive()
        stop.set()
        counters = results.get(timeout=30)
        robot.terminate()
    finally:
        for p in (learner, robot):
            p.join(10)
            if p.is_alive():
                p.kill()
    rows_refused = counters["rejected"].get("steps_invalid", 0)
    return {"name": "bad_config_and_device_data", "injected": n_config + n_rows + n_robot, "produced": 0,
            "stored": 0, "lost": 0, "duplicated": 0, "recovery_s": 0.0,
            "errors": config_errors + rows_refused + robot_refused,
            "clear_errors": config_clear + robot_clear, "with_messages": n_config + n_robot,
            "learner_refused_by_reason": counters["rejected"], "robot_refused_by_reason": robot_rejected,
            "learner_kept_serving": learner_alive and acked and counters["taken"] == 1,
            "robot_kept_serving": robot_alive and robot_serving, "learner_rows_injected": row_cases,
            "examples": (messages + robot_messages)[::2]}
