"""The rank-local link with real MPI ranks (mpiexec from the mpich wheel) and a real learner server."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from embodyrl.hal import runtime
from embodyrl.hal.coupling.link import CouplingConfig
from embodyrl.hal.steps import NO_POLICY, PolicyVersion

pytest.importorskip("mpi4py")
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")

CFG = CouplingConfig(levels=12, features=3, context=2, radius=1, max_correction=2.0)
COLUMNS = [5, 17, 3, 11]  # unequal on purpose

RANK_PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    from mpi4py import MPI
    from embodyrl.hal import runtime
    from embodyrl.hal.coupling.link import CouplingConfig, CouplingLink

    args = json.loads(sys.argv[1])
    rank = MPI.COMM_WORLD.rank
    n = args["columns"][rank]
    cfg = CouplingConfig(**args["config"])
    time.sleep(args["late"].get(str(rank), 0.0))
    link = CouplingLink(cfg, rank, runtime.load(args["policy"], seed=rank), seed=rank)
    rng = np.random.default_rng(rank)
    zeros, shapes_ok, largest = 0, True, 0.0
    start = time.monotonic()
    for step in range(args["steps"]):
        if rank == args["die_rank"] and step == args["die_step"]:
            os._exit(1)  # a crash: no BYE, no MPI_Finalize
        dtype = np.float32 if rank % 2 else np.float64
        state = rng.normal(size=(n, cfg.levels, cfg.features)).astype(dtype)
        info = {"context": rng.normal(size=(n, cfg.context)), "target": np.full((n, cfg.levels), 0.5)}
        correction = link.exchange(state, info)
        shapes_ok &= correction.shape == (n, cfg.levels) and correction.dtype == dtype
        zeros += int(not correction.any())
        largest = max(largest, float(np.abs(correction).max()))
        time.sleep(args["sleep"])
    elapsed = time.monotonic() - start
    link.close(flush_s=5.0)
    result = {"rank": rank, "columns": n, "shapes_ok": bool(shapes_ok), "zero_exchanges": zeros,
              "largest": largest, "version": list(link.version), "warnings": link.stats.warnings,
              "steps_sent": link.stats.steps_sent, "elapsed": elapsed}
    with open(os.path.join(args["out"], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
""")


def level_policy(tmp_path: Path, version: PolicyVersion, seed: int = 0, cfg: CouplingConfig = CFG,
                 name: str = "policy"):
    """A random per-level actor in the export format (what the learner writes), no JAX needed."""
    rng = np.random.default_rng(seed)
    arrays = {"actor/layers/0/kernel": rng.normal(size=(cfg.window, 8)) * 0.5 / np.sqrt(cfg.window),
              "actor/layers/0/bias": np.zeros(8), "actor/layers/1/kernel": rng.normal(size=(8, 1)),
              "actor/layers/1/bias": np.zeros(1), "scale/center": np.zeros(1),
              "scale/half_range": np.full(1, cfg.max_correction)}
    graph = {"format": runtime.FORMAT, "format_version": runtime.FORMAT_VERSION, "algo": "ddpg",
             "policy_version": list(version), "observation_spec": cfg.level_observation_spec().to_msg(),
             "action_spec": cfg.level_action_spec().to_msg(), "exploration": {"kind": "gaussian", "std": 0.1},
             "graph": [{"op": "concat", "fields": ["window"]},
                       {"op": "dense", "kernel": "actor/layers/0/kernel", "bias": "actor/layers/0/bias"},
                       {"op": "relu"},
                       {"op": "dense", "kernel": "actor/layers/1/kernel", "bias": "actor/layers/1/bias"},
                       {"op": "tanh"}, {"op": "scale", "center": "scale/center", "half_range": "scale/half_range"}]}
    runtime.save(tmp_path / name, graph, arrays)
    return tmp_path / name, {k: np.asarray(v, np.float32) for k, v in arrays.items() if k.startswith("actor/")}


class LearnerThread:
    """A real LearnerServer polled in a thread: acks, grants credits, publishes weights on request."""

    def __init__(self, peer_timeout_s: float = 30.0):
        from embodyrl.transport.server import LearnerServer

        self.server = LearnerServer(run_id="coupling-test", incarnation=17,  # policy files: 7, an earlier one
                                    peer_timeout_s=peer_timeout_s)
        self.endpoint = self.server.endpoint
        self.rows: dict[tuple[int, int], int] = {}
        self.batches = 0
        self.rewards: list[float] = []
        self.received: list = []
        """Every batch's Steps, as the server decoded and validated it."""
        self._publish: tuple | None = None
        self._publish_after: tuple | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def publish(self, version, arrays) -> None:
        self._publish = (version, arrays)

    def publish_after_hello(self, actor_id: int, delay_s: float, version, arrays) -> None:
        """Publish ``delay_s`` after actor ``actor_id`` said HELLO (it acts without weights until then)."""
        self._publish_after = (actor_id, delay_s, version, arrays, None)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for batch in self.server.poll(20):
                s = batch.steps
                key = (int(s.actor_id[0]), int(s.device_id[0]))
                assert (s.actor_id == key[0]).all() and (s.device_id == key[1]).all()
                self.rows[key] = self.rows.get(key, 0) + len(s)
                self.batches += 1
                self.rewards.extend(s.reward.tolist())
                self.received.append(s)
                self.server.ack(batch.session, batch.seq, credits=len(s))
            for identity, session in self.server.sessions.items():
                if self.server.credits.held(identity) < 1 << 19:  # a new session, or one said HELLO again
                    self.server.grant(session, (1 << 20) - self.server.credits.held(identity))
            if self._publish is not None:
                self.server.publish(*self._publish)
                self._publish = None
            if self._publish_after is not None:
                actor_id, delay, version, arrays, seen = self._publish_after
                if seen is None and any(s.actor_id == actor_id for s in self.server.sessions.values()):
                    self._publish_after = (actor_id, delay, version, arrays, time.monotonic())
                elif seen is not None and time.monotonic() - seen > delay:
                    self.server.publish(version, arrays)
                    self._publish_after = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.server.close()


def run_ranks(tmp_path, n, *, learner, policy, steps=20, sleep=0.01, late=None, die_rank=-1, die_step=-1,
              config=None, wait_s=60.0):
    """Start ``n`` ranks; return their results once every surviving rank has written one."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    script = tmp_path / "rank.py"
    script.write_text(RANK_PROGRAM)
    cfg = config or CFG.__dict__ | {"learner": learner, "connect_timeout_s": 10.0}
    args = {"columns": COLUMNS, "config": cfg, "policy": str(policy), "steps": steps, "sleep": sleep,
            "late": {str(k): v for k, v in (late or {}).items()}, "die_rank": die_rank, "die_step": die_step,
            "out": str(out)}
    proc = subprocess.Popen([MPIEXEC, "-disable-auto-cleanup", "-n", str(n), sys.executable, str(script),
                             json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    survivors = [r for r in range(n) if r != die_rank]
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            if all((out / f"rank{r}.json").exists() for r in survivors):
                break
            if proc.poll() is not None and proc.returncode != 0:
                break
            time.sleep(0.1)
        if die_rank < 0:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:  # MPI_Finalize waits forever for a dead rank: MPI's limit, not the link's
            os.killpg(proc.pid, signal.SIGKILL)
        log = proc.communicate(timeout=10)[0].decode(errors="replace")
    results = {r: json.loads((out / f"rank{r}.json").read_text()) for r in survivors
               if (out / f"rank{r}.json").exists()}
    assert sorted(results) == survivors, f"ranks {sorted(set(survivors) - set(results))} did not finish:\n{log}"
    return results, proc.returncode, log


@pytest.mark.parametrize("n", [1, 2, 4])
def test_each_rank_gets_its_own_corrections_and_streams_its_own_steps(tmp_path, n):
    policy, arrays = level_policy(tmp_path, PolicyVersion(7, 0))
    learner = LearnerThread()
    learner.publish(PolicyVersion(7, 1), {k: v * 0.5 for k, v in arrays.items()})  # weights reach every rank
    try:
        results, rc, log = run_ranks(tmp_path, n, learner=learner.endpoint, policy=policy, steps=20)
        time.sleep(0.3)
    finally:
        learner.close()
    assert rc == 0, log
    for r, res in results.items():
        assert res["columns"] == COLUMNS[r] and res["shapes_ok"]
        assert res["zero_exchanges"] == 0 and 0 < res["largest"] <= CFG.max_correction
        assert res["version"] == [7, 1]  # each rank took the published weights itself
        assert learner.rows[(r, r)] == 20 * COLUMNS[r] == res["steps_sent"]  # tagged by rank, all arrived
    assert set(learner.rows) == {(r, r) for r in range(n)}
    assert all(-4.0 <= x <= 0.0 for x in learner.rewards)  # -mean(((a - 0.5) / 2) ** 2) with |a| <= 2


def test_a_crashed_rank_does_not_hold_up_the_others(tmp_path):
    policy, _ = level_policy(tmp_path, PolicyVersion(7, 0))
    learner = LearnerThread()
    try:
        results, _, log = run_ranks(tmp_path, 4, learner=learner.endpoint, policy=policy, steps=40,
                                    sleep=0.02, die_rank=2, die_step=5)
        time.sleep(0.3)
    finally:
        learner.close()
    assert sorted(results) == [0, 1, 3]
    for r, res in results.items():
        assert res["zero_exchanges"] == 0 and learner.rows[(r, r)] == 40 * COLUMNS[r]
    assert learner.rows.get((2, 2), 0) <= 5 * COLUMNS[2]  # the dead rank's steps stop with it


def test_late_rank_and_missing_weights_give_zero_corrections_not_a_hang(tmp_path):
    policy, arrays = level_policy(tmp_path, NO_POLICY)  # an export that never saw a learner
    learner = LearnerThread()
    try:
        learner.publish_after_hello(0, 0.5, PolicyVersion(7, 1), arrays)
        results, rc, log = run_ranks(tmp_path, 2, learner=learner.endpoint, policy=policy, steps=60,
                                     sleep=0.05, late={1: 2.5})
    finally:
        learner.close()
    assert rc == 0, log
    early = results[0]
    assert 0 < early["zero_exchanges"] < 60 and early["warnings"]["no_weights"] == early["zero_exchanges"]
    assert early["version"] == [7, 1]
    late = results[1]  # joined after the weights were published: the learner sent them on HELLO
    assert late["version"] == [7, 1] and late["zero_exchanges"] <= 2


def test_an_unreachable_learner_gives_zero_corrections_within_the_deadline(tmp_path):
    policy, _ = level_policy(tmp_path, PolicyVersion(7, 0))
    cfg = CFG.__dict__ | {"learner": "tcp://127.0.0.1:9", "connect_timeout_s": 0.5, "reconnect_s": 0.2}
    results, rc, log = run_ranks(tmp_path, 2, learner=None, policy=policy, steps=20, config=cfg, wait_s=30)
    assert rc == 0, log
    for res in results.values():
        assert res["zero_exchanges"] == 20 and res["warnings"]["learner_lost"] == 20
        assert res["shapes_ok"] and res["elapsed"] < 5.0  # short handshakes only, never a hang
