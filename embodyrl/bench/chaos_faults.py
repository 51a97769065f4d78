"""Chaos scenarios without a live link: disk full under the replay, bad config, bad device data.

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


def bad_input(quick: bool) -> dict:
    """Bad config values and bad device data: each refused with an error naming the field."""
    from embodyrl import envs
    from embodyrl.algos import registry
    from embodyrl.config import TrainConfig, from_dict, to_dict
    from embodyrl.hal.specs import SpecError

    section = registry.get(TrainConfig().algorithm).section  # the default algorithm's settings
    config_cases = [({"stpes": 3}, "stpes"), ({section: {"lr": 1.0}}, f"{section}.lr"),
                    ({"algorithm": "a2c"}, "algorithm"), ({"steps": "many"}, "steps"),
                    ({section: {"hidden_sizes": 64}}, f"{section}.hidden_sizes"),
                    ({section: {"discount": "high"}}, f"{section}.discount")]
    errors, clear, messages = 0, 0, []
    for change, field in config_cases:
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
    device, _ = envs.make("pendulum")
    with device:
        good = device.reset(seed=0)
        bad_observations = []
        for key, value in good.items():
            nan = np.array(value, copy=True)
            nan.reshape(-1)[0] = np.nan
            bad_observations += [(key, {**good, key: nan}),
                                 (key, {**good, key: np.zeros(np.shape(value) + (2,), np.asarray(value).dtype)}),
                                 (key, {k: v for k, v in good.items() if k != key})]
        for key, observation in bad_observations:
            try:
                device.observation_spec.validate(observation)
            except (SpecError, KeyError, ValueError) as err:
                errors += 1
                clear += key in str(err)
                messages.append(str(err))
        for action in (np.array([np.nan], np.float32), np.zeros(3, np.float32)):
            try:
                device.step(action)
            except (SpecError, ValueError) as err:
                errors += 1
                clear += device.action_spec.name in str(err)
                messages.append(str(err))
    injected = len(config_cases) + len(bad_observations) + 2
    return {"name": "bad_config_and_device_data", "injected": injected, "produced": 0, "stored": 0, "lost": 0,
            "duplicated": 0, "recovery_s": 0.0, "errors": errors, "clear_errors": clear,
            "examples": messages[:: max(1, len(messages) // 5)]}
