"""The chaos benchmark, quick: the JSON shape, and nothing lost or duplicated under each fault."""

import json
import math

import pytest

from embodyrl.bench import chaos, chaos_link

KEYS = {"name", "injected", "produced", "stored", "lost", "duplicated", "recovery_s"}


def check_record(record):
    assert set(record) >= KEYS, record
    assert all(math.isfinite(record[k]) for k in KEYS - {"name"})
    assert record["lost"] == 0 and record["duplicated"] == 0, record
    json.dumps(record)


def check_exact_once(record):
    """Every row the actor's ledger names is in the replay once, and nothing else of it is."""
    check_record(record)
    assert record["injected"] > 0 and record["produced"] > 0
    assert record["stored"] == record["produced"] and record["digest_match"], record


def test_actor_killed_twice_resends_what_its_spool_and_journal_held_and_loses_no_step():
    kill = chaos_link.actor_kill(True)
    check_exact_once(kill)
    assert all(n > 0 for n in kill["unacked_at_kill"]), "each kill must leave rows only the spool holds"
    # every step the device took is in the replay but the one each kill may cut between the device
    # and the recorder (with batches of 16, losing the unbatched rows would lose about 8 a kill)
    assert kill["stepped"] > 100 and 0 <= kill["stepped_not_stored"] <= kill["injected"], kill


def test_learner_side_crashed_twice_keeps_what_it_committed():
    check_exact_once(chaos_link.learner_kill(True))


def test_partition_loses_nothing_and_the_realtime_actor_keeps_stepping():
    cut = chaos_link.partition(True)
    check_exact_once(cut)
    assert min(cut["rows_produced_during_partition"]) > 0
    assert max(cut["rows_stored_during_partition"]) <= 16  # at most the one batch in flight at the cut


@pytest.mark.slow
def test_quick_bench_prints_the_headline_figures():
    result = chaos.run(quick=True, only=("hostile", "slow_learner", "watchdog_under_flood"))
    for key in chaos.FIGURES:
        assert key in result
    for record in result["scenarios"]:
        assert record["lost"] == record["duplicated"] == 0, record
    hostile = next(r for r in result["scenarios"] if r["name"] == "hostile_traffic")
    check_record(hostile)
    assert result["honest_ratio_under_attack"] == hostile["honest_ratio_under_attack"]
    json.dumps(result)


def test_quick_fault_scenarios_give_clear_errors_and_keep_the_buffer_consistent():
    result = chaos.run(quick=True, only=("disk_full", "bad_input"))
    disk, bad = result["scenarios"]
    for record in (disk, bad):
        check_record(record)
    assert bad["errors"] == bad["injected"]  # every bad input refused ...
    assert bad["clear_errors"] == bad["with_messages"]  # ... naming the field, where an answer comes back
    assert bad["learner_kept_serving"] and bad["robot_kept_serving"]
    assert bad["learner_refused_by_reason"] == {"steps_invalid": len(bad["learner_rows_injected"])}
    if "skipped" not in disk:  # needs root to mount a tmpfs
        assert disk["consistent"] and disk["clear_errors"] == disk["injected"]
        assert disk["stored"] == disk["produced"] > 0


def test_console_impostors_get_no_command_and_every_estop_reaches_its_owner():
    pytest.importorskip("starlette")
    result = chaos.run(quick=True, only=("console_impostor",))
    (record,) = result["scenarios"]
    check_record(record)
    assert result["console_commands_misrouted"] == record["console_commands_misrouted"] == 0, record
    assert record["stored"] == record["produced"] > 0 and record["operator_actions_failed"] == 0, record
    assert record["impostor_welcomes"] == 0 and record["impostor_refusals"] > 0, record
    assert "restarted_actor_reconnect_s_under_flood" in result  # None until its scenario runs
