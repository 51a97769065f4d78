"""Who may lift an e-stop at the robot server: each latch records who set it; only someone with that
authority clears it (the table in docs/safety.md).

Real RobotServers on threads of this process, real ZeroMQ sockets, CurveZMQ keys where a test is
about keys; the driver notes every action it receives.
"""

from __future__ import annotations

import time

import pytest
import test_robot_server_hardening as hardening
from test_robot_server_hardening import GO, Raw, TwoJoints, _safe

from embodyrl.hal.robot_server import DriverDeadlines

serve, keyring = hardening.serve, hardening.keyring  # its fixtures, shared


def _latches(raw: Raw) -> list[tuple[str, str | None, str]]:
    return [(latch["by"], latch["name"], latch["reason"]) for latch in raw.ask("STATUS").fields["estops"]]


def _step(raw: Raw):
    return raw.ask("STEP", {"action": GO})


def _refused(reply, reason: str) -> str:
    assert reply is not None and reply.kind == "ERROR", reply
    assert reply.fields["reason"] == reason, reply.fields
    return reply.fields["detail"]


def test_the_owner_cannot_lift_an_admins_estop_and_the_driver_gets_no_action_after_it(serve, keyring):
    server = serve(watchdog_s=2.0, keys=keyring.server, admin_keys=keyring.admins)
    actor, admin = Raw(server.endpoint, keyring.client("actor")), Raw(server.endpoint, keyring.client("admin"))
    try:
        assert actor.ask("HELLO").kind == "SPECS" and actor.ask("RESET").kind == "OBS" and _step(actor).kind == "OBS"
        assert admin.ask("ESTOP", reason="maintenance").kind == "OK"
        commanded = len(server.driver.sent())
        assert _safe(server.driver.sent()[-1])
        detail = _refused(actor.ask("CLEAR"), "estop_by_admin")
        assert "admin key 'admin'" in detail and "maintenance" in detail and "only an admin key" in detail
        assert "admin" in _refused(actor.ask("RESET"), "estopped")
        assert "admin" in _refused(_step(actor), "estopped")
        assert len(server.driver.sent()) == commanded, "the driver received an action after the admin's e-stop"
        assert _latches(actor) == [("admin", "admin", "maintenance")]
        status = actor.ask("STATUS").fields
        assert status["clears_refused"] == 1 and "maintenance" in status["estop"]
        # an admin key lifts it; release=False keeps the actor's session (what a console with an admin key sends)
        reply = admin.ask("CLEAR", release=False)
        assert reply.kind == "OK" and reply.fields["released"] is False
        assert _latches(actor) == []
        assert actor.ask("RESET").kind == "OBS" and _step(actor).kind == "OBS"
        assert server.driver.sent()[-1].tolist() == GO.tolist()
    finally:
        actor.close()
        admin.close()


def test_the_owner_clears_the_watchdogs_latch_and_its_own(serve):
    server = serve(watchdog_s=0.1)
    actor = Raw(server.endpoint)  # no keys: the connection owns the session
    try:
        assert actor.ask("HELLO").kind == "SPECS" and actor.ask("RESET").kind == "OBS" and _step(actor).kind == "OBS"
        time.sleep(0.3)  # silent past the watchdog
        assert [by for by, _, _ in _latches(actor)] == ["watchdog"]
        _refused(_step(actor), "watchdog")
        assert actor.ask("CLEAR").kind == "OK"
        assert _latches(actor) == []
        assert _step(actor).kind == "OBS" and server.driver.sent()[-1].tolist() == GO.tolist()
        assert actor.ask("ESTOP", reason="operator").kind == "OK"
        assert _latches(actor) == [("owner", None, "operator")]
        _refused(_step(actor), "estopped")
        assert actor.ask("CLEAR").kind == "OK" and _latches(actor) == []
        assert _step(actor).kind == "OBS"
    finally:
        actor.close()


def test_each_of_several_latches_is_cleared_only_by_someone_with_its_authority(serve, keyring):
    server = serve(watchdog_s=0.1, keys=keyring.server, admin_keys=keyring.admins)
    actor, admin = Raw(server.endpoint, keyring.client("actor")), Raw(server.endpoint, keyring.client("admin"))
    try:
        assert actor.ask("HELLO").kind == "SPECS" and actor.ask("RESET").kind == "OBS" and _step(actor).kind == "OBS"
        time.sleep(0.3)  # the watchdog trips
        assert admin.ask("ESTOP", reason="inspection").kind == "OK"
        assert sorted(by for by, _, _ in _latches(actor)) == ["admin", "watchdog"]
        detail = _refused(actor.ask("CLEAR"), "estop_by_admin")  # the watchdog's goes, the admin's stays
        assert "watchdog" in detail and "admin key 'admin'" in detail
        assert _latches(actor) == [("admin", "admin", "inspection")]
        assert admin.ask("CLEAR", release=False).kind == "OK" and _latches(actor) == []
        assert _step(actor).kind == "OBS"  # both lifted, each by someone who may
    finally:
        actor.close()
        admin.close()


def test_the_latch_survives_the_owners_reconnect_and_another_keys_session(serve, keyring):
    server = serve(watchdog_s=0.1, keys=keyring.server, admin_keys=keyring.admins)
    actor, admin = Raw(server.endpoint, keyring.client("actor")), Raw(server.endpoint, keyring.client("admin"))
    try:
        assert actor.ask("HELLO").kind == "SPECS" and actor.ask("RESET").kind == "OBS"
        assert admin.ask("ESTOP", reason="maintenance").kind == "OK"
        actor.close()  # the actor dies and restarts: a fresh ZeroMQ identity with the same key resumes
        actor = Raw(server.endpoint, keyring.client("actor"))
        assert actor.ask("HELLO").kind == "SPECS"
        _refused(actor.ask("RESET"), "estopped")
        _refused(actor.ask("CLEAR"), "estop_by_admin")
        assert admin.ask("CLEAR", release=False).kind == "OK"
        # the owner's own e-stop outlives its BYE: another key that takes the session may not lift it
        assert actor.ask("ESTOP", reason="operator").kind == "OK" and actor.ask("BYE").kind == "OK"
        intruder = Raw(server.endpoint, keyring.client("intruder"))
        try:
            assert intruder.ask("HELLO").kind == "SPECS"
            detail = _refused(intruder.ask("CLEAR"), "estop_by_owner")
            assert "key 'actor'" in detail and _latches(intruder) == [("owner", "actor", "operator")]
            assert intruder.ask("BYE").kind == "OK"
        finally:
            intruder.close()
        assert actor.ask("HELLO").kind == "SPECS" and actor.ask("CLEAR").kind == "OK"  # its own key may
        assert actor.ask("RESET").kind == "OBS"
    finally:
        actor.close()
        admin.close()


def test_the_latch_survives_a_keyless_takeover(serve):
    server = serve(watchdog_s=0.1)
    first = Raw(server.endpoint)
    try:
        assert first.ask("HELLO").kind == "SPECS" and first.ask("RESET").kind == "OBS"
        assert first.ask("ESTOP", reason="operator").kind == "OK"
    finally:
        first.close()
    time.sleep(0.3)  # silent past watchdog_s: another connection may take the session, not the latch
    second = Raw(server.endpoint)
    try:
        assert second.ask("HELLO").kind == "SPECS"
        _refused(second.ask("RESET"), "estopped")
        assert _latches(second) == [("owner", None, "operator")]
        assert second.ask("CLEAR").kind == "OK" and second.ask("RESET").kind == "OBS"  # without keys, the owner may
    finally:
        second.close()


def test_no_software_lifts_a_hung_driver_not_even_an_admin(serve, keyring):
    driver = TwoJoints()
    server = serve(driver, watchdog_s=1.0, keys=keyring.server, admin_keys=keyring.admins,
                   deadlines=DriverDeadlines(command_s=0.1))
    actor, admin = Raw(server.endpoint, keyring.client("actor")), Raw(server.endpoint, keyring.client("admin"))
    try:
        assert actor.ask("HELLO").kind == "SPECS" and actor.ask("RESET").kind == "OBS"
        driver.hang_next = True
        _refused(_step(actor), "driver_hung")
        _refused(admin.ask("ESTOP", reason="inspection"), "driver_hung")  # latched, but no safe action can run
        assert sorted(by for by, _, _ in _latches(actor)) == ["admin", "driver"]
        _refused(admin.ask("CLEAR", release=False), "driver_hung")
        _refused(actor.ask("CLEAR"), "driver_hung")
        assert [by for by, _, _ in _latches(actor)] == ["driver"]  # the admin's own is lifted; the driver's stays
    finally:
        driver.release.set()
        actor.close()
        admin.close()


def test_an_admin_request_from_outside_the_session(serve, keyring):
    from embodyrl.hal.drivers.remote import RemoteError, admin_request

    server = serve(watchdog_s=2.0, keys=keyring.server, admin_keys=keyring.admins)
    actor = Raw(server.endpoint, keyring.client("actor"))
    try:
        assert actor.ask("HELLO").kind == "SPECS" and actor.ask("RESET").kind == "OBS"
        assert admin_request(server.endpoint, keyring.client("admin"), "ESTOP", reason="console")["released"] is False
        _refused(actor.ask("RESET"), "estopped")
        assert admin_request(server.endpoint, keyring.client("admin"), "CLEAR")["released"] is False
        assert actor.ask("RESET").kind == "OBS"  # the session was kept
        with pytest.raises(RemoteError) as err:  # a key that is not an admin's is refused by name
            admin_request(server.endpoint, keyring.client("monitor"), "CLEAR")
        assert err.value.reason == "no_session"
    finally:
        actor.close()
