"""The console's own limits, against a real console process over loopback: a token by default, a
Host check against DNS rebinding, a cap on the body of an action, caps on actors and on the state,
and 400 (never 500) for malformed numbers and deep nesting. Every flood is bounded in count and time."""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("PIL")

import zmq  # noqa: E402
from console_helpers import ConsoleProcess, wait_for  # noqa: E402

from embodyrl.console.process import LinkPeer, RawPeer  # noqa: E402
from embodyrl.hal.wire import control  # noqa: E402
from embodyrl.hal.wire.codec import encode  # noqa: E402
from tests.cli_helpers import in_process  # noqa: E402

REBIND = "rebind.attacker.test"


def request(console, path: str, body: bytes | dict | None = None, headers: dict | None = None,
            token: bool = True) -> tuple[int, bytes]:
    headers = dict(headers or {})
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
        body = body if isinstance(body, bytes) else json.dumps(body).encode()
    if token and console.token:
        headers["Authorization"] = f"Bearer {console.token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(console.url + path, data=body, headers=headers),
                                    timeout=20) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()



def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def raw_http(port: int, head: str, chunks, budget: int = 16 << 20, seconds: float = 15.0) -> tuple[bytes, int]:
    """Send ``head`` then the body ``chunks`` over one socket until the server answers or stops
    reading, at most ``budget`` bytes and ``seconds``: (the answer's first bytes, body bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setblocking(False)
    sent, answer, deadline = 0, b"", time.monotonic() + seconds
    try:
        _send_all(sock, head.encode(), deadline)
        for chunk in chunks:
            if sent >= budget or time.monotonic() > deadline:
                break
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                if not _send_all(sock, chunk, min(deadline, time.monotonic() + 2)):
                    break  # the server stopped reading
            except OSError:  # reset or broken pipe: it closed the connection
                break
            sent += len(chunk)
        end = time.monotonic() + 5
        while time.monotonic() < end and b"\r\n" not in answer:
            readable, _, _ = select.select([sock], [], [], 0.2)
            if readable:
                try:
                    data = sock.recv(4096)
                except OSError:
                    break
                if not data:
                    break
                answer += data
    finally:
        sock.close()
    return answer, sent


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> bool:
    view = memoryview(data)
    while view:
        _, writable, _ = select.select([], [sock], [], max(0.0, deadline - time.monotonic()))
        if not writable:
            return False
        view = view[sock.send(view):]
    return True


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    with ConsoleProcess(tmp_path_factory.mktemp("limits")) as console, LinkPeer(console.control, "actor", 0) as peer:
        wait_for(lambda: json.loads(request(console, "/api/state")[1])["actors"], what="the actor")
        console.peer = peer
        yield console


def test_a_token_is_required_even_on_loopback(console, tmp_path):
    assert console.token, "the console prints a token on loopback too"
    assert request(console, "/api/state", token=False)[0] == 401
    assert request(console, "/api/state")[0] == 200
    with ConsoleProcess(tmp_path, "--no-token") as trusted:
        assert trusted.token is None and request(trusted, "/api/state", token=False)[0] == 200
    off = in_process("console", tmp_path, "--bind", "0.0.0.0:8799", "--insecure", "--no-token")
    assert off.returncode == 2 and "--no-token: only on loopback" in off.stderr


def test_a_rebinding_host_is_refused(console):
    host = {"Host": f"{REBIND}:{console.port}", "Origin": f"http://{REBIND}:{console.port}"}
    before = len(console.peer.commands)
    assert request(console, "/api/action", {"action": "clear_estop"}, headers=host)[0] == 403
    assert request(console, "/api/state", headers=host)[0] == 403
    assert request(console, "/", headers=host)[0] == 403
    assert len(console.peer.commands) == before, "a request under a foreign Host reached an actor"
    handshake = (f"GET /ws?token={console.token} HTTP/1.1\r\nHost: {REBIND}:{console.port}\r\nUpgrade: websocket\r\n"
                 "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    answer, _ = raw_http(console.port, handshake, ())
    assert answer and not answer.startswith(b"HTTP/1.1 101"), answer[:80]
    for name in ("localhost", "127.0.0.1"):
        assert request(console, "/api/state", headers={"Host": f"{name}:{console.port}"})[0] == 200, name


def test_public_host_names_are_admitted(tmp_path):
    with ConsoleProcess(tmp_path, "--public-host", "console.lab.test") as console:
        assert request(console, "/api/state", headers={"Host": f"console.lab.test:{console.port}"})[0] == 200
        assert request(console, "/api/state", headers={"Host": f"{REBIND}:{console.port}"})[0] == 403


def _post_head(console, length: str) -> str:
    return (f"POST /api/action?token={console.token} HTTP/1.1\r\nHost: 127.0.0.1:{console.port}\r\n"
            f"Content-Type: application/json\r\n{length}\r\n\r\n")


def test_a_huge_body_is_refused_without_being_read(console):
    rss = rss_mb(console.process.pid)
    chunk = b" " * (64 << 10)
    answer, sent = raw_http(console.port, _post_head(console, f"Content-Length: {200 << 20}"), iter(lambda: chunk, None))
    assert answer.startswith(b"HTTP/1.1 413"), (answer[:80], sent)
    assert sent < 16 << 20, f"the console read {sent} bytes of a body it refuses"
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    answer, sent = raw_http(console.port, _post_head(console, "Transfer-Encoding: chunked"), iter(lambda: framed, None))
    assert answer.startswith(b"HTTP/1.1 413"), (answer[:80], sent)
    assert sent < 16 << 20
    assert rss_mb(console.process.pid) - rss < 50


def test_deep_nesting_and_huge_numbers_are_answered_400(console):
    deep = b'{"action": "estop", "value": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    assert len(deep) < 64 << 10
    assert request(console, "/api/action", deep)[0] == 400
    assert request(console, "/api/action", b"[" * 30_000 + b"]" * 30_000)[0] == 400
    for body in ({"action": "estop", "actor": 0, "device": 2**70}, {"action": "estop", "device": 2**70},
                 {"action": "estop", "actor": 2**70}, {"action": "estop", "actor": 0, "value": 2**70},
                 {"action": "stream", "actor": 0, "value": {"fps": 2**70, "width": 160}},
                 {"action": "estop", "actor": 0, "device": 1e400}):
        status, answer = request(console, "/api/action", body)
        assert status == 400, (body, status, answer)
    assert console.process.poll() is None


def test_a_hello_flood_keeps_the_actors_and_the_state_capped(console):
    """1,500 HELLOs with new actor ids (300 connections, 5 ids each) within 15 s; then the actors
    table holds at most 256 actors, /api/state stays small and quick, and the actor that was there
    still takes an e-stop."""
    devices = [{"device_id": d, "name": f"arm-{d}", "cameras": ["camera/front", "camera/wrist"], "teleop": False}
               for d in range(4)]
    rss = rss_mb(console.process.pid)
    context = zmq.Context()
    refusals: list[bytes] = []
    try:
        sockets = []
        deadline = time.monotonic() + 15
        for n in range(300):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(console.control)
            sockets.append(sock)
            for k in range(5):
                sock.send_multipart(encode(control.HELLO, {"protocol": 1, "role": "actor", "actor_id": 1000 + 5 * n + k,
                                                           "devices": devices}))
            assert time.monotonic() < deadline
        end = time.monotonic() + 10
        while time.monotonic() < end and len(refusals) < 1244:
            for sock in sockets:
                while sock.poll(0):
                    frames = sock.recv_multipart()
                    if b"REFUSED" in frames[0]:
                        refusals.append(frames[0])
            time.sleep(0.05)
        started = time.monotonic()
        status, body = request(console, "/api/state")
        answered_s = time.monotonic() - started
        shown = json.loads(body)
        assert status == 200 and len(shown["actors"]) <= 256, len(shown["actors"])
        assert len(body) < 2 << 20 and answered_s < 2.0, (len(body), answered_s)
        assert any(b"256" in r for r in refusals), "the actor beyond the cap is refused by name"
        assert rss_mb(console.process.pid) - rss < 100
        fat = [{"device_id": d, "name": "x" * 64, "cameras": [f"camera/{c:03d}" + "y" * 100 for c in range(16)],
                "teleop": False} for d in range(120)]
        fresh = context.socket(zmq.DEALER)
        fresh.setsockopt(zmq.LINGER, 0)
        fresh.connect(console.control)
        fresh.send_multipart(encode(control.HELLO, {"protocol": 1, "role": "actor", "actor_id": 99, "devices": fat}))
        assert fresh.poll(5000), "a fat HELLO is answered"
        answer = fresh.recv_multipart()[0]
        assert b"REFUSED" in answer and b"devices" in answer, answer[:200]
    finally:
        context.destroy(linger=0)
    with RawPeer(console.control, "actor", 0, hello_every_s=1.0) as impostor:
        wait_for(lambda: impostor.refusals or impostor.welcomes, what="an answer")
        status, body = request(console, "/api/action", {"action": "estop", "actor": 0, "device": 0})
        assert status == 200 and json.loads(body)["status"] == "ok" and console.peer.commands[-1] == "estop"
        assert impostor.commands == []
