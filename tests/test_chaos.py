"""The chaos benchmark, quick: the JSON shape, and nothing lost or duplicated under each fault."""

import json
import math

from embodyrl.bench import chaos

KEYS = {"name", "injected", "produced", "stored", "lost", "duplicated", "recovery_s"}


def check_record(record):
    assert set(record) >= KEYS, record
    assert all(math.isfinite(record[k]) for k in KEYS - {"name"})
    assert record["lost"] == 0 and record["duplicated"] == 0, record
    json.dumps(record)


def test_quick_link_scenarios_lose_and_duplicate_nothing():
    result = chaos.run(quick=True, only=("actor_kill", "learner_kill", "partition", "hostile"))
    names = [s["name"] for s in result["scenarios"]]
    assert names == ["actor_kill_restart", "learner_kill_restart", "network_partition", "hostile_traffic"]
    for record in result["scenarios"]:
        check_record(record)
        assert record["injected"] > 0 and record["produced"] > 0
        # a row spooled by an actor killed before it logged the row counts as stored, not produced
        assert record["stored"] - record["stored_not_logged"] == record["produced"], record
        assert record["checksum_match"] or record["stored_not_logged"] > 0, record
    kill = result["scenarios"][0]
    assert all(n > 0 for n in kill["unacked_at_kill"]), "each kill must leave rows only the spool holds"
    cut = result["scenarios"][2]  # the real-time actor kept stepping while nothing got through
    assert min(cut["rows_produced_during_partition"]) > 0
    assert max(cut["rows_stored_during_partition"]) <= 16  # at most the one batch in flight at the cut
    attack = result["scenarios"][3]
    assert attack["injected"] - 5 <= attack["rejected"] <= attack["injected"]  # the last few may be in flight
    assert attack["only_honest_sessions"]


def test_quick_fault_scenarios_give_clear_errors_and_keep_the_buffer_consistent():
    result = chaos.run(quick=True, only=("disk_full", "bad_input"))
    disk, bad = result["scenarios"]
    for record in (disk, bad):
        check_record(record)
    assert bad["errors"] == bad["injected"] == bad["clear_errors"]
    if "skipped" not in disk:  # needs root to mount a tmpfs
        assert disk["consistent"] and disk["clear_errors"] == disk["injected"]
        assert disk["stored"] == disk["produced"] > 0
