"""Issue 10, scenario 1 with the real processes: the JAX learner SIGKILLed and resumed, actors
reconnecting by themselves; every row the actors' ledgers name is in the replay exactly once."""

import numpy as np
import pytest

from embodyrl.bench import chaos_process
from embodyrl.hal.ledger import BatchLedger, ledger_totals, read_ledger
from embodyrl.hal.steps import rows_digest
from embodyrl.hal.wire.codec import encode
from embodyrl.hal.wire.spool import Spool


def _columns(n, actor=1, episode=7, first=0):
    return {"actor_id": np.full(n, actor, np.int32), "device_id": np.zeros(n, np.int32),
            "episode_id": np.full(n, episode, np.int64), "step_index": np.arange(first, first + n, dtype=np.int32)}


def test_digest_adds_over_batches_and_sees_a_duplicate_or_a_loss():
    whole = rows_digest(_columns(10))
    parts = (rows_digest(_columns(4)) + rows_digest(_columns(6, first=4))) % 2**64
    assert whole == parts
    assert rows_digest(_columns(11)) != whole  # one more row
    dup = {k: np.concatenate([v, v[:1]]) for k, v in _columns(10).items()}
    assert rows_digest(dup) != whole
    assert rows_digest(_columns(10, actor=2)) != whole


def test_ledger_reconciles_a_batch_spooled_but_not_recorded(tmp_path):
    spool = Spool(tmp_path / "spool")
    ledger = BatchLedger(tmp_path / "ledger.jsonl")
    for seq, first in ((1, 0), (2, 5)):
        spool.push(seq, 5, encode("steps", {"seq": seq}, _columns(5, first=first)))
    ledger.record(1, _Rows(_columns(5)))  # killed before the second line, mid-way through it
    ledger.close()
    with (tmp_path / "ledger.jsonl").open("a") as f:
        f.write('{"seq": 2, "ro')
    ledger = BatchLedger(tmp_path / "ledger.jsonl")  # the restarted actor
    assert ledger.reconcile(spool) == 1
    ledger.close()
    assert sorted(read_ledger(tmp_path / "ledger.jsonl")) == [1, 2]
    assert ledger_totals(tmp_path / "ledger.jsonl") == (10, rows_digest(_columns(10)))


class _Rows(dict):
    def __len__(self):
        return len(self["step_index"])


def check_sigkill_and_resume(result: dict) -> None:
    assert result["produced"] > 2000
    assert result["lost"] == result["duplicated"] == 0 and result["digest_match"]
    assert result["stored"] == result["produced"]
    assert result["resumed_from_updates"][0] > 0  # training went on from the checkpoint
    assert result["injected"] == 2
    # every WELCOME, ACK and credit went to a live connection of its actor
    assert result["learner_refused"].get("send_failed", 0) == 0, result["learner_refused"]


def test_real_learner_sigkilled_and_resumed_loses_and_duplicates_nothing():
    check_sigkill_and_resume(chaos_process.learner_sigkill(quick=True))


@pytest.mark.slow
@pytest.mark.parametrize("run", range(1, 21), ids=lambda run: f"run{run:02d}")
def test_real_learner_sigkilled_and_resumed_20_times_in_a_row(run):
    """The scenario once failed on a quiet box: actor 0 finished its steps with its last batch
    unacknowledged, its final flush (10 s) ran out before the learner's ``--resume`` restart
    listened, and it exited 0; the batch was never stored. Each run is a fresh scenario (its
    timings differ with the load); ``-x`` stops at the first failure. About a minute each on
    two busy cores."""
    check_sigkill_and_resume(chaos_process.learner_sigkill(quick=True))


@pytest.mark.slow
def test_a_learner_with_two_ingest_workers_sigkilled_and_resumed_loses_and_duplicates_nothing():
    """The same faults with ``learner.ingest_workers 2``: the workers die with their learner (PDEATHSIG),
    the resumed learner reopens both shards, and each actor finds its shard again through the learner.
    Slow (about a minute: two learner starts, each starting its workers); tests/test_ingest_workers.py
    kills a worker, resumes every shard and checks placement in the default suite."""
    check_sigkill_and_resume(chaos_process.learner_sigkill(quick=True, ingest_workers=2))
