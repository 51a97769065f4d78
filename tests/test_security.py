"""CurveZMQ on real sockets: an authorised actor gets in, others never complete the handshake."""

import threading
import time

import numpy as np
import pytest

from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.client import LearnerLink, LinkError
from embodyrl.hal.wire.security import (
    ClientKeys,
    SecurityError,
    ServerKeys,
    generate_keys,
    is_loopback,
    load_keys,
)
from embodyrl.transport import LearnerServer

DEVICE = P.DeviceInfo(0, "d", DictSpec.of(ArraySpec("x", (1,), np.float32)),
                      ArraySpec("action", (1,), np.float32, -1, 1))


@pytest.fixture
def keys(tmp_path):
    generate_keys(tmp_path / "learner", "learner")
    generate_keys(tmp_path / "authorized", "good-actor")
    generate_keys(tmp_path / "elsewhere", "bad-actor")
    return tmp_path


@pytest.fixture
def secure_server(keys):
    server = LearnerServer("tcp://127.0.0.1:*", run_id="r", incarnation=1,
                           keys=ServerKeys(keys / "learner" / "learner.key_secret", keys / "authorized"))
    stop = threading.Event()

    def pump():
        while not stop.is_set():
            server.poll(20)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    yield server
    stop.set()
    thread.join(5)
    server.close()


def link(server, keys, actor_key, timeout=3.0):
    return LearnerLink(server.endpoint, actor_name="a", actor_id=0, devices=[DEVICE], handshake_timeout_s=timeout,
                       keys=ClientKeys(actor_key, keys / "learner" / "learner.key"))


def test_authorised_actor_completes_the_handshake(secure_server, keys):
    with link(secure_server, keys, keys / "authorized" / "good-actor.key_secret") as ok:
        assert ok.run_id == "r"


def test_unauthorised_actor_is_refused(secure_server, keys):
    start = time.monotonic()
    with pytest.raises(LinkError, match="not authorised there"):  # at once: the handshake failed
        link(secure_server, keys, keys / "elsewhere" / "bad-actor.key_secret", timeout=1.5).connect()
    assert time.monotonic() - start < 5
    assert not secure_server.sessions


def test_plain_client_cannot_talk_to_a_curve_server(secure_server):
    plain = LearnerLink(secure_server.endpoint, actor_name="p", actor_id=1, devices=[DEVICE], handshake_timeout_s=1.0)
    with pytest.raises(LinkError, match="no WELCOME"):
        plain.connect()
    assert not secure_server.sessions


def test_plain_tcp_off_loopback_must_be_asked_for():
    with pytest.raises(SecurityError, match="refusing plain TCP"):
        LearnerServer("tcp://0.0.0.0:*", run_id="r", incarnation=1)
    with pytest.raises(SecurityError, match="refusing plain TCP"):
        LearnerLink("tcp://10.1.2.3:5555", actor_name="a", actor_id=0, devices=[DEVICE])
    server = LearnerServer("tcp://0.0.0.0:*", run_id="r", incarnation=1, allow_insecure=True)
    server.close()


@pytest.mark.parametrize(("endpoint", "local"), [
    ("tcp://127.0.0.1:5", True), ("tcp://localhost:5", True), ("tcp://[::1]:5", True),
    ("ipc:///tmp/x", True), ("tcp://0.0.0.0:5", False), ("tcp://10.0.0.1:5", False),
    ("tcp://robot.lab:5", False), ("tcp://eth0:5", False),
])
def test_loopback_detection(endpoint, local):
    assert is_loopback(endpoint) is local


def test_key_files_are_checked(tmp_path, keys):
    public, secret = load_keys(keys / "learner" / "learner.key_secret")
    assert len(public) == 40 and secret is not None
    assert load_keys(keys / "learner" / "learner.key")[1] is None
    assert oct((keys / "learner" / "learner.key_secret").stat().st_mode & 0o777) == "0o600"
    (tmp_path / "junk.key").write_text("not a key")
    with pytest.raises(SecurityError):
        load_keys(tmp_path / "junk.key")
    with pytest.raises(SecurityError, match="does not exist"):
        load_keys(tmp_path / "missing.key")


def test_keys_command_writes_a_usable_pair(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "embodyrl.cli", "keys", str(tmp_path), "robot-3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    public, secret = load_keys(tmp_path / "robot-3.key_secret")
    assert secret is not None and load_keys(tmp_path / "robot-3.key")[0] == public
