"""The rank-local link with real MPI ranks (mpiexec from the mpich wheel) and the real coupling learner."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from embodyrl.coupling.testing import ServedCoupling, random_export
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
    served = ServedCoupling(CFG)
    try:
        policy = served.export(tmp_path / "policy")  # its weights at start: version (incarnation, 0)
        served.publish()  # weights reach every rank (on its HELLO): (incarnation, 1)
        results, rc, log = run_ranks(tmp_path, n, learner=served.endpoint, policy=policy, steps=20)
        time.sleep(0.3)
    finally:
        served.close()
    learner = served.learner
    assert rc == 0, log
    assert served.version.count == 1 and served.version != runtime.load(policy).version
    rows = served.rows()
    for r, res in results.items():
        assert res["columns"] == COLUMNS[r] and res["shapes_ok"]
        assert res["zero_exchanges"] == 0 and 0 < res["largest"] <= CFG.max_correction
        assert res["version"] == list(served.version)  # each rank took the published weights itself
        # tagged by rank, all arrived: the ring counts rows as it holds them (a resend is dropped before it)
        assert rows[(r, r)] == learner.steps_by_rank[r] == 20 * COLUMNS[r] == res["steps_sent"]
    for t in served.taken:  # every row of a batch is its sender's: actor id = device id = the rank
        assert (t.steps.actor_id == t.actor_id).all() and (t.steps.device_id == t.actor_id).all()
    assert set(rows) == {(r, r) for r in range(n)} and set(learner.steps_by_rank) == set(range(n))
    rewards = np.concatenate([t.steps.reward for t in served.taken])
    assert all(-4.0 <= x <= 0.0 for x in rewards)  # -mean(((a - 0.5) / 2) ** 2) with |a| <= 2


def test_a_crashed_rank_does_not_hold_up_the_others(tmp_path):
    served = ServedCoupling(CFG)
    try:
        policy = served.export(tmp_path / "policy")
        results, _, log = run_ranks(tmp_path, 4, learner=served.endpoint, policy=policy, steps=40,
                                    sleep=0.02, die_rank=2, die_step=5)
        time.sleep(0.3)
    finally:
        served.close()
    steps_by_rank = served.learner.steps_by_rank
    assert sorted(results) == [0, 1, 3]
    for r, res in results.items():
        assert res["zero_exchanges"] == 0 and steps_by_rank[r] == 40 * COLUMNS[r]
    assert steps_by_rank.get(2, 0) <= 5 * COLUMNS[2]  # the dead rank's steps stop with it


def test_late_rank_and_missing_weights_give_zero_corrections_not_a_hang(tmp_path):
    served = ServedCoupling(CFG)
    try:
        policy = served.export(tmp_path / "policy", NO_POLICY)  # an export that never saw a learner
        served.when(lambda c: any(s.actor_id == 0 for s in c.server.sessions.values()),  # rank 0's HELLO
                    lambda c: c.publish(), delay_s=0.5)
        results, rc, log = run_ranks(tmp_path, 2, learner=served.endpoint, policy=policy, steps=60,
                                     sleep=0.05, late={1: 2.5})
    finally:
        served.close()
    assert rc == 0, log
    early = results[0]
    assert 0 < early["zero_exchanges"] < 60 and early["warnings"]["no_weights"] == early["zero_exchanges"]
    assert early["version"] == list(served.version) and served.version.count == 1
    late = results[1]  # joined after the weights were published: the learner sent them on HELLO
    assert late["version"] == list(served.version) and late["zero_exchanges"] <= 2


def test_an_unreachable_learner_gives_zero_corrections_within_the_deadline(tmp_path):
    policy = random_export(tmp_path, PolicyVersion(7, 0), cfg=CFG)
    cfg = CFG.__dict__ | {"learner": "tcp://127.0.0.1:9", "connect_timeout_s": 0.5, "reconnect_s": 0.2}
    results, rc, log = run_ranks(tmp_path, 2, learner=None, policy=policy, steps=20, config=cfg, wait_s=30)
    assert rc == 0, log
    for res in results.values():
        assert res["zero_exchanges"] == 20 and res["warnings"]["learner_lost"] == 20
        assert res["shapes_ok"] and res["elapsed"] < 5.0  # short handshakes only, never a hang
