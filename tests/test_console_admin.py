"""The console and an admin's e-stop, with real processes and sockets on loopback: a real RobotServer
with CurveZMQ keys and an admin key, a real actor loop (in a thread) driving it through RemoteDevice
and reporting to a real console process. Only a console given the admin key, for that robot server,
lifts an admin's e-stop; it sends the admin CLEAR to the robot server itself, and its own e-stop
latches as an admin's."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import test_robot_server_hardening as hardening  # noqa: E402
from console_helpers import wait_for  # noqa: E402
from test_robot_server_hardening import _safe  # noqa: E402

from embodyrl.cli import build_parser  # noqa: E402
from embodyrl.cli.console import options_of  # noqa: E402
from embodyrl.cli.security import SecurityOptionError  # noqa: E402
from embodyrl.console.process import ConsoleProcess, LoopThread  # noqa: E402
from embodyrl.hal.actor import ActorConfig, ActorLoop  # noqa: E402
from embodyrl.hal.console import ConsoleLink  # noqa: E402
from embodyrl.hal.drivers.remote import RemoteDevice, admin_request  # noqa: E402
from embodyrl.hal.link import NullLink  # noqa: E402
from embodyrl.hal.policy import UniformRandomPolicy  # noqa: E402
from embodyrl.hal.task import Task  # noqa: E402

serve, keyring = hardening.serve, hardening.keyring  # its fixtures: servers on threads, key pairs


class Still(Task):
    """Episodes of 40 steps; reward: closeness of the joints to zero."""

    max_episode_steps = 40

    def reward(self, observation, action, next_observation):
        return float(-np.abs(next_observation["qpos"]).sum())

    def terminated(self, next_observation):
        return False


@contextlib.contextmanager
def remote_actor(server, keyring, console):
    """Actor 0: a loop in a thread driving ``server`` through RemoteDevice with the actor's key, at the
    driver's 20 Hz, random actions, no learner, dialling ``console``."""
    device = RemoteDevice(server.endpoint, keys=keyring.client("actor"), timeout_s=1.0, retries=2)
    device.connect()  # the specs come from the server
    link = ConsoleLink(console.control, role="actor", actor_id=0)
    loop = ActorLoop(device, Still(), UniformRandomPolicy(device.action_spec, seed=0), NullLink(),
                     ActorConfig(actor_id=0, realtime=True, random_steps=10**9), console=link)
    with LoopThread(device, loop, link) as actor:
        yield actor
    assert actor.error is None, actor.error


def moved(server) -> int:
    """Actions other than the safe one that the driver received."""
    return sum(not _safe(action) for action in server.driver.sent())


def latches(server) -> list[tuple[str, str | None, str]]:
    return [(latch["by"], latch["name"], latch["reason"]) for latch in server.status()["estops"]]


def device_view(console) -> dict:
    state = console.request("/api/state")[1]
    actor = next((a for a in state["actors"] if a["actor_id"] == 0), None)
    return actor["devices"][0] if actor is not None and actor["devices"] else {}


def act(console, action: str) -> dict:
    status, answer = console.request("/api/action", {"action": action, "actor": 0, "device": 0})
    assert status == 200, answer
    return answer



def admin_estop(server, keyring, reason: str) -> None:
    """An admin's e-stop from outside the console (another admin's tool), then the page shows it."""
    assert admin_request(server.endpoint, keyring.client("admin"), "ESTOP", reason=reason)["released"] is False


def test_without_the_admin_key_the_consoles_clear_fails_naming_why_and_the_driver_gets_nothing(
        tmp_path, serve, keyring):
    server = serve(watchdog_s=2.0, keys=keyring.server, admin_keys=keyring.admins)
    with ConsoleProcess(tmp_path) as console, remote_actor(server, keyring, console):
        wait_for(lambda: moved(server) >= 5, what="the actor to step the robot")
        admin_estop(server, keyring, "maintenance")
        shown = wait_for(lambda: (d := device_view(console)).get("estopped") and d, what="the page to show it")
        assert "admin key 'admin'" in shown["estop_reason"] and "maintenance" in shown["estop_reason"], shown
        assert shown["admin_robot"] is None
        before = moved(server)
        answer = act(console, "clear_estop")
        assert answer["status"] == "failed", answer
        error = answer["error"]
        assert "estop_by_admin" in error and "only an admin key may clear it" in error, error  # the server's refusal
        assert "--admin-key" in error and "--admin-robot 0:0=ROBOT" in error, error  # and what it would take
        time.sleep(0.5)  # the actor holds the device: 10 control periods
        assert moved(server) == before, "the driver received an action after the admin's e-stop"
        assert latches(server) == [("admin", "admin", "maintenance")]
        assert device_view(console)["estopped"], "the page shows the latch still set"
        assert server.status()["clears_refused"] == 1


def test_with_the_admin_key_the_console_clears_an_admins_estop_and_its_own_estop_is_an_admins(
        tmp_path, serve, keyring):
    server = serve(watchdog_s=2.0, keys=keyring.server, admin_keys=keyring.admins)
    admin = keyring.client("admin")
    robot = f"robot server {server.endpoint} (actor 0 device 0)"
    with ConsoleProcess(tmp_path, "--admin-key", str(admin.secret_key_file), "--admin-robot",
                        f"0={server.endpoint},{admin.server_key_file}") as console, \
            remote_actor(server, keyring, console):
        wait_for(lambda: moved(server) >= 5, what="the actor to step the robot")
        assert wait_for(lambda: device_view(console), what="the page to show the actor")["admin_robot"] == server.endpoint
        admin_estop(server, keyring, "maintenance")
        wait_for(lambda: device_view(console).get("estopped"), what="the page to show the admin's e-stop")
        answer = act(console, "clear_estop")
        assert answer["status"] == "ok", answer
        assert [r["target"] for r in answer["results"]] == [robot, "actor 0 device 0"], answer["results"]
        assert latches(server) == []
        wait_for(lambda: not device_view(console)["estopped"], what="the page to show the latch cleared")
        before = moved(server)
        wait_for(lambda: moved(server) >= before + 5, what="the actor to step again (its CLEAR and RESET)")
        status = server.status()
        assert status["controlled"] is True and status["admin_releases"] == 0, "the actor kept its session"

        # the console's own e-stop latches at the robot server as an admin's: the actor cannot lift it
        answer = act(console, "estop")
        assert answer["status"] == "ok", answer
        assert {r["target"] for r in answer["results"]} == {robot, "actor 0 device 0"}
        assert ("admin", "admin") in {(by, name) for by, name, _ in latches(server)}, latches(server)
        assert any("operator console e-stop" in reason for by, _, reason in latches(server) if by == "admin")
        wait_for(lambda: device_view(console).get("estopped"), what="the page to show the console's e-stop")
        before = moved(server)
        time.sleep(0.3)
        assert moved(server) == before, "the driver received an action after the console's e-stop"
        assert act(console, "clear_estop")["status"] == "ok"
        assert latches(server) == []
        wait_for(lambda: moved(server) >= before + 5, what="the actor to step again")


def _options(tmp_path, *args: str):
    return options_of(build_parser().parse_args(["console", str(tmp_path / "run"), *args]))


def test_the_admin_key_reaches_only_robot_servers_the_operator_names(tmp_path, keyring):
    admin = keyring.client("admin")
    key, server_key = str(admin.secret_key_file), str(admin.server_key_file)
    robot_file = tmp_path / "arm.yaml"
    robot_file.write_text("device:\n  endpoint: tcp://127.0.0.1:5556\n  keys:\n    secret_key: actor.key_secret\n"
                          f"    server_key: {server_key}\ntask:\n  factory: x:y\n")
    options = _options(tmp_path, "--admin-key", key, "--admin-robot", f"2:1={robot_file}",
                       "--admin-robot", f"0=tcp://127.0.0.1:5557,{server_key}")
    try:
        robots = options.admin.robots
        assert set(robots) == {(2, 1), (0, 0)}
        assert robots[2, 1].endpoint == "tcp://127.0.0.1:5556" and str(robots[2, 1].server_key) == server_key
        assert [r.endpoint for r in options.admin.targets(None, None)] == ["tcp://127.0.0.1:5557",
                                                                           "tcp://127.0.0.1:5556"]
        assert options.admin.targets(2, 0) == [] and options.admin.targets(1, None) == []
    finally:
        options.admin.close()
    refusals = {
        ("--admin-key", key): "--admin-key needs the robot servers",
        ("--admin-robot", f"0=tcp://127.0.0.1:5557,{server_key}"): "--admin-robot needs --admin-key",
        ("--admin-key", server_key, "--admin-robot", f"0=tcp://127.0.0.1:5557,{server_key}"): "no secret key",
        ("--admin-key", key, "--admin-robot", f"0=tcp://127.0.0.1:5557,{key}x"): "does not exist",
        ("--admin-key", key, "--admin-robot", "0=tcp://127.0.0.1:5557"): "ENDPOINT,SERVER_KEY_FILE",
        ("--admin-key", key, "--admin-robot", f"zero=tcp://127.0.0.1:5557,{server_key}"): "ACTOR[:DEVICE]=ROBOT",
        ("--admin-key", key, "--admin-robot", f"0=tcp://127.0.0.1:1,{server_key}",
         "--admin-robot", f"0:0=tcp://127.0.0.1:2,{server_key}"): "actor 0 device 0 is given two robot servers",
    }
    for args, expected in refusals.items():
        with pytest.raises(SecurityOptionError, match=expected.replace("[", r"\[").replace("]", r"\]")):
            _options(tmp_path, *args).admin.close()
    local = tmp_path / "local.yaml"
    local.write_text("device:\n  factory: embodyrl.envs.arm:make_device\ntask:\n  factory: x:y\n")
    with pytest.raises(SecurityOptionError, match="device.endpoint: none given"):
        _options(tmp_path, "--admin-key", key, "--admin-robot", f"0={local}")
