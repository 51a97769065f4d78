"""No silent wait for a robot server or a learner: on real sockets, each way the first handshake
goes wrong either fails at once naming its cause (ZeroMQ's monitor makes it certain) or is named
in one hint line while the client keeps trying until its deadline.

What libzmq tells the client (see :class:`embodyrl.hal.wire.security.HandshakeWatch`): a key the
server does not authorise, HANDSHAKE_FAILED_AUTH; keys on one side only, HANDSHAKE_FAILED_PROTOCOL;
a wrong server key, HANDSHAKE_FAILED_NO_DETAIL on every reconnect; nothing listening, nothing.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time

import numpy as np
import pytest
import zmq

from embodyrl.envs import pendulum
from embodyrl.hal.drivers.remote import RemoteDevice, RemoteError, RemoteTimeout
from embodyrl.hal.robot_server import DeviceDriver, RobotServer
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.client import HandshakeFailed, LearnerLink, LinkError
from embodyrl.hal.wire.security import ClientKeys, ServerKeys, generate_keys
from embodyrl.transport import LearnerServer
from tests.cli_helpers import cli, in_process

DEVICE = P.DeviceInfo(0, "d", DictSpec.of(ArraySpec("x", (1,), np.float32)),
                      ArraySpec("action", (1,), np.float32, -1, 1))
FAST = 1.5
"""A certain cause fails well within this (the handshake deadlines below are longer)."""


class Keys:
    def __init__(self, root):
        self.root = root
        for directory, name in (("server", "server"), ("actor", "actor"), ("stranger", "stranger"),
                                ("other", "other")):
            generate_keys(root / directory, name)
        (root / "authorized").mkdir()
        shutil.copy(root / "actor" / "actor.key", root / "authorized")
        self.server = ServerKeys(root / "server" / "server.key_secret", root / "authorized")

    def client(self, name: str = "actor", server: str = "server") -> ClientKeys:
        return ClientKeys(self.root / name / f"{name}.key_secret", self.root / server / f"{server}.key")


@pytest.fixture
def keys(tmp_path):
    return Keys(tmp_path / "keys")


def _within(seconds: float, *args):
    """``embodyrl ARGS`` in this process (:func:`in_process`), on a thread so that a hang fails the test
    (a command that gets as far as setting signal handlers fails there: they need the main thread)."""
    done = []
    thread = threading.Thread(target=lambda: done.append(in_process(*args)), daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"embodyrl {args[0]} still waiting after {seconds} s"
    assert done, f"embodyrl {args[0]} raised (see the thread's exception above)"
    return done[0], time.monotonic() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def robot_server(served):
    """A pendulum behind a robot server (keyed with ``keys``)."""

    def start(keys: ServerKeys | None = None) -> RobotServer:
        server = RobotServer(DeviceDriver(pendulum.make_device()), watchdog_s=5.0, keys=keys)
        return served(server, server.serve)

    return start


@pytest.fixture
def learner(served):
    """A real learner transport on loopback (keyed with ``keys``), polled on a thread."""

    def start(keys: ServerKeys | None = None, **options) -> LearnerServer:
        server = LearnerServer("tcp://127.0.0.1:*", run_id="r", incarnation=1, keys=keys, **options)

        def serve(stop: threading.Event) -> None:
            while not stop.is_set():
                server.poll(20)

        return served(server, serve)

    return start


def _remote_fails_at_once(endpoint: str, keys: ClientKeys | None, match: str) -> None:
    hints = []
    device = RemoteDevice(endpoint, keys=keys, timeout_s=1.0, retries=2, hint_after_s=0.5, on_hint=hints.append)
    start = time.monotonic()
    with pytest.raises(RemoteError, match=match) as err:
        device.connect()
    assert time.monotonic() - start < FAST
    assert err.value.reason == "handshake" and not isinstance(err.value, RemoteTimeout)
    assert not hints  # the cause is certain: no guessing first


def _link(endpoint: str, keys: ClientKeys | None, hints: list, timeout: float = 4.0) -> LearnerLink:
    return LearnerLink(endpoint, actor_name="a", actor_id=0, devices=[DEVICE], handshake_timeout_s=timeout,
                       keys=keys, hint_after_s=1.0, on_hint=hints.append, reconnect_s=0.2)


def _link_fails_at_once(endpoint: str, keys: ClientKeys | None, match: str) -> None:
    hints = []
    start = time.monotonic()
    with pytest.raises(HandshakeFailed, match=match):
        _link(endpoint, keys, hints).connect()
    assert time.monotonic() - start < FAST
    assert not hints


CAUSES = {
    # cause: (the client's keys, whether the server has keys, what the error says)
    "key-not-authorised": (lambda keys: keys.client("stranger"), True,
                           "refused our CurveZMQ key .*not authorised there; add our public key .*stranger.key"),
    "wrong-server-key": (lambda keys: keys.client(server="other"), True,
                         "dropped the CurveZMQ handshake twice: the server key we hold .*other.key.* is not its key"),
    "plain-against-keyed": (lambda keys: None, True, "wants CurveZMQ keys and we dialled without"),
    "keyed-against-plain": (lambda keys: keys.client(), False, "speaks plain TCP and we dialled with CurveZMQ keys"),
}


# -- the robot server ---------------------------------------------------------

@pytest.mark.parametrize("cause", CAUSES)
def test_a_certain_cause_fails_the_robot_server_connect_at_once(cause, robot_server, keys):
    client, keyed_server, match = CAUSES[cause]
    server = robot_server(keys.server if keyed_server else None)
    _remote_fails_at_once(server.endpoint, client(keys), match)


def test_nothing_listening_is_said_once_on_stderr_then_times_out(capsys, keys):
    device = RemoteDevice(f"tcp://127.0.0.1:{_free_port()}", keys=keys.client(), timeout_s=0.5, retries=2,
                          hint_after_s=1.0)  # 0.5 + 1 + 2 s in all
    start = time.monotonic()
    with pytest.raises(RemoteTimeout, match="no connection was ever made; likely nothing listening") as err:
        device.connect()
    assert 3.0 < time.monotonic() - start < 5.0  # every attempt was made
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("embodyrl: no answer from tcp://127.0.0.1:") and "after 1 s" in lines[0]
    for cause in ("nothing listening", "our key not authorised", "the wrong server key", "keys against a plain"):
        assert cause in lines[0] and cause in str(err.value)


def test_the_right_keys_still_connect_and_say_nothing(robot_server, keys, capsys):
    server = robot_server(keys.server)
    with RemoteDevice(server.endpoint, keys=keys.client(), timeout_s=1.0, hint_after_s=0.2) as device:
        device.reset(seed=0)
        device.step(np.zeros(1, np.float32))
    assert capsys.readouterr().err == ""


# -- the learner --------------------------------------------------------------

@pytest.mark.parametrize("cause", CAUSES)
def test_a_certain_cause_fails_the_learner_handshake_at_once(cause, learner, keys):
    client, keyed_server, match = CAUSES[cause]
    server = learner(keys.server if keyed_server else None)
    _link_fails_at_once(server.endpoint, client(keys), "no WELCOME from .*" + match)
    assert not server.sessions


def test_a_refusal_fails_at_once(learner):
    server = learner(admit=lambda *_: "wrong specs")  # refuses every actor
    link = LearnerLink(server.endpoint, actor_name="a", actor_id=0, devices=[DEVICE], handshake_timeout_s=4.0)
    start = time.monotonic()
    with pytest.raises(HandshakeFailed, match="refused us"):
        link.connect()
    assert time.monotonic() - start < FAST


@pytest.mark.parametrize("listening", [False, True], ids=["nothing-listening", "silent-peer"])
def test_silence_is_named_once_and_waited_out(listening, keys):
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes the connection, never answers
    silent.linger = 0
    port = silent.bind_to_random_port("tcp://127.0.0.1") if listening else _free_port()
    if not listening:
        silent.close()
    hints = []
    start = time.monotonic()
    try:
        with pytest.raises(LinkError, match="no WELCOME .* within 2.5 s") as err:
            _link(f"tcp://127.0.0.1:{port}", None, hints, timeout=2.5).connect()
    finally:
        silent.close()
    assert 2.4 < time.monotonic() - start < 4.0
    assert not isinstance(err.value, HandshakeFailed)  # silence is never certain: exit 1, not 2
    assert len(hints) == 1 and "no answer from" in hints[0] and "nothing listening" in hints[0]
    seen = "connected, but no answer" if listening else "no connection was ever made"
    assert seen in hints[0] and "plain TCP against a server that wants keys" in hints[0]


# -- the commands -------------------------------------------------------------

def test_record_with_an_unauthorised_key_exits_2_at_once(robot_server, keys, tmp_path):
    """The measured hang: ``embodyrl record`` on a robot server that does not authorise this actor."""
    server = robot_server(keys.server)
    stranger = keys.client("stranger")
    (tmp_path / "robot.yaml").write_text(
        f"device:\n  endpoint: {server.endpoint}\n  keys:\n    secret_key: {stranger.secret_key_file}\n"
        f"    server_key: {stranger.server_key_file}\n  timeout_s: 2.0\n"
        "task:\n  reward:\n    terms:\n      - name: effort\n        weight: -1.0\n        squared: action\n"
        "control:\n  episode_steps: 50\n")
    out, took = _within(30, "record", tmp_path / "robot.yaml", "--teleop", "keyboard", "--episodes", "1",
                        "--out", tmp_path / "demos")
    assert took < 5  # its own deadline is 2 + 4 + 8 + 16 s: the cause is certain at once
    assert out.returncode == 2, out.stderr
    assert "refused our CurveZMQ key" in out.stderr and "stranger.key" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_actor_with_an_unauthorised_key_exits_2_at_once(learner, keys, tmp_path):
    server = learner(keys.server)
    stranger = keys.client("stranger")
    start = time.monotonic()  # a process of its own, as a person runs it (and it sets signal handlers)
    out = cli("actor", "pendulum", "--connect", server.endpoint, "--index", "0", "--max-steps", "10",
              "--secret-key", stranger.secret_key_file, "--server-key", stranger.server_key_file,
              "--actor.handshake_timeout_s", "60", timeout=60)
    assert out.returncode == 2, out.stderr
    assert time.monotonic() - start < 45  # its start-up (JAX) included, below its 60 s handshake deadline
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("embodyrl: actor: no WELCOME from") and "not authorised there" in last
    assert "Traceback" not in out.stderr
