"""The robot server against any peer: out-of-bounds actions, floods, a hung driver, other keys.

Servers run on threads of this process around a small driver that notes the
time of every command it receives; peers are real ZeroMQ sockets, and the
flooder is a separate (spawned, niced) process sending at full speed.
"""

from __future__ import annotations

import shutil
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from embodyrl.bench import chaos_robot
from embodyrl.hal import robot_server
from embodyrl.hal.drivers.remote import RemoteDevice, RemoteError
from embodyrl.hal.robot_server import DriverDeadlines, RobotDriver, RobotServer
from embodyrl.hal.specs import ArraySpec, DictSpec, SpecError
from embodyrl.hal.wire.codec import decode, encode
from embodyrl.hal.wire.security import (
    ClientKeys,
    RateLimits,
    SecurityError,
    ServerKeys,
    generate_keys,
    secure_client,
)

GO = np.array([0.5, -0.5], np.float32)


class TwoJoints(RobotDriver):
    """A stand-in arm: notes ``(time.monotonic(), action)`` per command; ``hang_next`` blocks one."""

    realtime = False

    def __init__(self, control_period_s: float = 0.05):
        self.action_spec = ArraySpec("joint_velocity", (2,), np.float32, -1.0, 1.0)
        self.observation_spec = DictSpec.of(ArraySpec("qpos", (2,), np.float32))
        self.control_period_s = control_period_s
        self.commands: list[tuple[float, np.ndarray]] = []
        self.q = np.zeros(2, np.float32)
        self.hang_next = False
        self.release = threading.Event()

    def reset(self, seed):
        self.q[:] = 0
        return {"qpos": self.q.copy()}

    def command(self, action):
        self.commands.append((time.monotonic(), np.array(action)))
        if self.hang_next:
            self.hang_next = False
            self.release.wait(30)  # a vendor SDK stuck in a blocking call
        self.q += action * self.control_period_s

    def read_observation(self):
        return {"qpos": self.q.copy()}

    def sent(self) -> list[np.ndarray]:
        return [action for _, action in self.commands]


@pytest.fixture
def serve(served):
    """Start RobotServers on threads of this process; unblock their drivers, then stop them, after."""
    started = []

    def start(driver: TwoJoints | None = None, **options) -> RobotServer:
        server = RobotServer(driver or TwoJoints(), **options)
        started.append(server)
        return served(server, server.serve)

    yield start
    for server in started:  # before ``served`` stops them: a hung driver call returns first
        server.driver.release.set()


class Raw:
    """A bare DEALER: sends what it is told, counts replies."""

    def __init__(self, endpoint: str, keys: ClientKeys | None = None):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        if keys is not None:
            secure_client(self.sock, keys)
        self.sock.connect(endpoint)
        self.seq = 0

    def send(self, kind: str, arrays: dict | None = None, **fields) -> None:
        self.seq += 1
        self.sock.send_multipart(encode(kind, {"seq": self.seq, **fields}, arrays))

    def ask(self, kind: str, arrays: dict | None = None, timeout_s: float = 3.0, **fields):
        self.send(kind, arrays, **fields)
        return self.receive(timeout_s)

    def receive(self, timeout_s: float):
        return decode(self.sock.recv_multipart()) if self.sock.poll(timeout_s * 1000) else None

    def close(self) -> None:
        self.sock.close()


def _safe(action: np.ndarray) -> bool:
    return not action.any()


# -- action bounds ---------------------------------------------------------
def test_an_out_of_bounds_step_is_refused_and_the_safe_action_commanded(serve):
    server = serve()
    with RemoteDevice(server.endpoint, timeout_s=2.0) as arm:
        arm.reset(seed=0)
        arm.step(GO)
        arm.step(np.ones(2, np.float32))  # on the bound is inside
        with pytest.raises(SpecError, match="out_of_bounds.*joint_velocity"):
            arm.step(np.array([5.0, -5.0], np.float32))
        status = arm.server_status()
        arm.step(GO)  # a refusal is not an e-stop
    sent = server.driver.sent()
    assert not any((np.abs(a) > 1).any() for a in sent), "the driver saw the out-of-bounds action"
    assert _safe(sent[2]) and sent[3].tolist() == GO.tolist()  # the safe action came right after
    assert status["out_of_bounds"] == 1 and status["clipped"] == 0 and status["rejected"]["out_of_bounds"] == 1


def test_an_out_of_bounds_step_is_clipped_when_the_server_says_clip(serve):
    server = serve(on_out_of_bounds="clip")
    with RemoteDevice(server.endpoint, timeout_s=2.0) as arm:
        arm.reset(seed=0)
        arm.step(np.array([5.0, -0.25], np.float32))
        status = arm.server_status()
    assert server.driver.sent()[0].tolist() == [1.0, -0.25]
    assert status["out_of_bounds"] == 1 and status["clipped"] == 1


def test_a_clipped_float32_action_is_inside_bounds_that_float32_cannot_hold():
    spec = ArraySpec("a", (1,), np.float32, -0.3, 0.3)  # float32(0.3) > 0.3 in float64
    assert robot_server._outside(spec, spec.clip(np.array([1.0]))) is None
    assert "maximum" in robot_server._outside(spec, np.array([0.31], np.float32))


# -- the watchdog under a flood ----------------------------------------------
def test_the_watchdog_stops_the_arm_on_time_while_another_process_floods_the_socket():
    # The server in a process of its own, as on a robot PC: in this one it would share the GIL and the
    # garbage collector with whatever earlier tests left behind. The bench's bound (one control period past
    # the watchdog, 120 ms) is its headline on a quiet machine; beside a niced training run and the niced slow
    # suite (load 8 to 10 on 2 cores) one trip in three took 199 ms: the test allows 150 ms past the watchdog.
    record = chaos_robot.watchdog_under_flood(quick=True)
    delays_ms = record["watchdog_delays_ms_under_flood"]
    slack_ms = 1e3 * record["watchdog_s"] + 150
    assert len(delays_ms) == record["flooded_trips"] >= 3, record
    assert max(delays_ms) <= slack_ms, f"safe action {max(delays_ms):.1f} ms after the last command: {record}"
    assert min(delays_ms) >= 1e3 * record["watchdog_s"] - 10, record  # not early either
    assert record["watchdog_trips_reported"] == record["flooded_trips"] + 3  # three quiet trips before the flood
    assert record["flood_messages_during_trips"] >= 3000 and record["rate_limited"] > 1000, record
    assert record["lost"] == record["duplicated"] == 0


# -- a hung driver -----------------------------------------------------------
def test_a_hung_driver_call_latches_an_estop_that_software_cannot_clear(serve):
    driver = TwoJoints()
    server = serve(driver, watchdog_s=1.0, deadlines=DriverDeadlines(command_s=0.1))
    actor, monitor = Raw(server.endpoint), Raw(server.endpoint)
    try:
        assert actor.ask("HELLO").kind == "SPECS" and actor.ask("RESET").kind == "OBS"
        assert actor.ask("STEP", {"action": GO}).kind == "OBS"
        driver.hang_next = True
        start = time.monotonic()
        reply = actor.ask("STEP", {"action": GO})
        assert reply is not None, "the server stopped answering"
        assert time.monotonic() - start < 1.0
        assert reply.kind == "ERROR" and reply.fields["reason"] == "driver_hung"
        assert "'command'" in reply.fields["detail"]
        status = monitor.ask("STATUS").fields
        assert status["driver_hung"] == "command" and status["driver_hung_s"] >= 0.1
        assert "hung" in status["estop"] and [latch["by"] for latch in status["estops"]] == ["driver"]
        for kind in ("CLEAR", "RESET", "STEP"):  # CLEAR is refused: the latch outlives software
            reply = actor.ask(kind, {"action": GO} if kind == "STEP" else None)
            assert reply.kind == "ERROR" and reply.fields["reason"] == "driver_hung", kind
        driver.release.set()  # the SDK call returns at last: the queued safe action goes out next
        deadline = time.monotonic() + 5
        while not _safe(driver.sent()[-1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _safe(driver.sent()[-1]) and len(driver.sent()) == 3
        later = monitor.ask("STATUS").fields
        assert later["driver_hung"] == "command" and later["driver_hung_s"] < 5
        assert actor.ask("CLEAR").fields["reason"] == "driver_hung"
    finally:
        actor.close()
        monitor.close()


def test_the_watchdog_thread_notices_a_hung_safe_action_that_nobody_waits_for(serve):
    driver = TwoJoints()
    server = serve(driver, watchdog_s=0.1, deadlines=DriverDeadlines(safe_s=0.1))
    with RemoteDevice(server.endpoint, timeout_s=2.0) as arm:
        arm.reset(seed=0)
        arm.step(GO)
        driver.hang_next = True  # the next command is the watchdog's safe action
        time.sleep(0.5)
        status = arm.server_status()
        assert status["watchdog_trips"] == 1 and status["driver_hung"] == "safe_action"
        with pytest.raises(RemoteError, match="'safe_action'") as err:
            arm.reset(seed=0)
        assert err.value.reason == "driver_hung"
        driver.release.set()


# -- keys: who may drive the robot -----------------------------------------
@pytest.fixture(scope="module")
def keyring(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    for name in ("robot", "actor", "intruder", "monitor", "admin", "stranger"):
        generate_keys(root / name, name)
    authorized, admins = root / "authorized", root / "admins"
    authorized.mkdir()
    admins.mkdir()
    for name in ("actor", "intruder", "monitor"):
        shutil.copy(root / name / f"{name}.key", authorized)
    shutil.copy(root / "admin" / "admin.key", admins)
    return SimpleNamespace(server=ServerKeys(root / "robot" / "robot.key_secret", authorized), admins=admins,
                           client=lambda name: ClientKeys(root / name / f"{name}.key_secret",
                                                          root / "robot" / "robot.key"))


def test_the_session_belongs_to_its_key_until_bye_or_an_admin_clear(serve, keyring):
    server = serve(watchdog_s=0.1, keys=keyring.server, admin_keys=keyring.admins)

    def device(name):
        return RemoteDevice(server.endpoint, keys=keyring.client(name), timeout_s=2.0, retries=1)

    actor = device("actor")
    actor.connect()
    actor.reset(seed=0)
    actor.step(GO)
    time.sleep(0.3)  # silent past watchdog_s: the arm is stopped, the session is still the actor's
    with pytest.raises(RemoteError) as err, device("intruder"):
        pass
    assert err.value.reason == "refused" and "another key" in str(err.value)
    actor._drop_socket()  # the actor process dies without BYE and restarts: a fresh ZeroMQ identity
    with device("actor") as restarted:
        with pytest.raises(RemoteError, match="watchdog"):
            restarted.step(GO)  # it resumed the session, trip included
        restarted.reset(seed=0)
        restarted.step(GO)
    # BYE released it
    intruder = device("intruder")
    intruder.connect()
    intruder.reset(seed=0)
    intruder.step(GO)
    admin = Raw(server.endpoint, keyring.client("admin"))
    try:
        reply = admin.ask("CLEAR")
        assert reply.kind == "OK" and reply.fields["released"] is True
        status = admin.ask("STATUS").fields
    finally:
        admin.close()
    assert _safe(server.driver.sent()[-1])  # the safe action before the release
    with pytest.raises(RemoteError) as err:
        intruder.step(GO)
    assert err.value.reason == "no_session"
    intruder._drop_socket()
    with device("actor") as again:
        again.reset(seed=0)
    assert status["controlled"] is False and status["secured"] is True
    assert status["resumed"] == 1 and status["admin_releases"] == 1 and status["takeovers_refused"] == 1


def test_a_key_that_is_not_authorised_never_completes_the_handshake(serve, keyring):
    server = serve(keys=keyring.server)
    for keys, says in ((keyring.client("stranger"), "not authorised"), (None, "wants CurveZMQ keys")):  # nor plain
        start = time.monotonic()
        with pytest.raises(RemoteError, match=says) as refused:
            RemoteDevice(server.endpoint, keys=keys, timeout_s=2.0, retries=2).connect()
        assert refused.value.reason == "handshake" and time.monotonic() - start < 2.0  # at once, not by silence


def test_plain_tcp_off_loopback_is_refused_without_insecure(capsys):
    with pytest.raises(SecurityError, match="plain TCP"):
        RobotServer(TwoJoints(), "tcp://0.0.0.0:*")
    with pytest.raises(SecurityError, match="plain TCP"):
        RemoteDevice("tcp://192.0.2.1:5556")
    RemoteDevice("tcp://192.0.2.1:5556", allow_insecure=True)  # allowed, explicitly (not connected)
    RobotServer(TwoJoints(), "tcp://0.0.0.0:*", allow_insecure=True).close()
    assert robot_server.main(["embodyrl.envs.arm:make_device", "--bind", "tcp://0.0.0.0:5556"]) == 2
    assert "--bind" in capsys.readouterr().err


# -- rate limits -----------------------------------------------------------
def test_sessionless_requests_are_rate_limited_before_they_are_decoded(serve, monkeypatch):
    decoded = []
    real_decode = robot_server.decode
    monkeypatch.setattr(robot_server, "decode", lambda *a: decoded.append(1) or real_decode(*a))
    server = serve(rate_limits=RateLimits(per_key_per_s=5, per_key_burst=5, global_per_s=20, global_burst=20))
    with RemoteDevice(server.endpoint, timeout_s=2.0) as arm:
        arm.reset(seed=0)
        start = time.monotonic()
        peers = [Raw(server.endpoint) for _ in range(30)]  # fresh identities gain nothing
        try:
            for peer in peers:
                for _ in range(10):
                    peer.send("STATUS")
            for _ in range(20):
                arm.step(GO)  # the session's own requests are never limited
            time.sleep(0.2)
            answered = sum(1 for peer in peers for _ in range(10) if peer.receive(0) is not None)
            elapsed = time.monotonic() - start
        finally:
            for peer in peers:
                peer.close()
        status = arm.server_status()
    assert answered <= 20 + 20 * elapsed + 1
    assert status["rate_limited"] >= 300 - answered
    assert len(decoded) == answered + 24  # and the actor's HELLO, RESET, 20 STEPs, STATUS, BYE: no dropped one


def test_a_flooding_key_spends_its_own_budget_not_the_other_keys(serve, keyring):
    limits = RateLimits(per_key_per_s=5, per_key_burst=5, global_per_s=20, global_burst=20)
    server = serve(keys=keyring.server, rate_limits=limits)
    intruder, monitor = Raw(server.endpoint, keyring.client("intruder")), Raw(server.endpoint, keyring.client("monitor"))
    try:
        assert intruder.ask("STATUS") is not None  # the handshake is done
        start = time.monotonic()
        for _ in range(200):
            intruder.send("STATUS")
        answered = 0
        while intruder.receive(0.2) is not None:
            answered += 1
        assert answered <= 5 + 5 * (time.monotonic() - start) + 1
        assert all(monitor.ask("STATUS", timeout_s=2.0) is not None for _ in range(5))
    finally:
        intruder.close()
        monitor.close()
