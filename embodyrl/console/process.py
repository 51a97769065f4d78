"""``embodyrl console`` as a child process on free ports, and peers to dial it: for benchmarks,
tests and scripts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEVICE = {"device_id": 0, "name": "arm", "cameras": [], "teleop": False}
"""What :class:`LinkPeer` and :class:`RawPeer` declare as an actor."""


class ConsoleProcess:
    """``embodyrl console RUN_DIR ARGS...`` until the ``with`` block ends; ``url``, ``control``
    (the endpoint peers dial), the ``token`` it printed (None with ``--no-token``) and ``page``,
    the URL to open (with the token)."""

    def __init__(self, run_dir: str | Path, *args: str, bind_host: str = "127.0.0.1"):
        self.port, control_port = free_port(), free_port()
        self.control = f"tcp://127.0.0.1:{control_port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "embodyrl.cli", "console", str(run_dir),
                        "--bind", f"{bind_host}:{self.port}", "--control", self.control, *args]
        self.process: subprocess.Popen | None = None
        self.token: str | None = None

    @property
    def page(self) -> str:
        return f"{self.url}/" + (f"?token={self.token}" if self.token else "")

    def request(self, path: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, dict]:
        """(status, JSON answer) of a GET of ``path``, or a POST of ``body``, with the token."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url + path, data=data, headers=headers),
                                        timeout=timeout) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def __enter__(self) -> ConsoleProcess:
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the console exited: {self.process.stderr.read()}")
            if line.startswith("console: "):
                if "?token=" in line:
                    self.token = line.strip().split("?token=", 1)[1]
                return self
        self.__exit__()
        raise RuntimeError("the console did not start within 60 s")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class LoopThread:
    """An actor loop in a thread of this process, with its device connected, until the ``with``
    block ends (then its console link closes); ``error`` is what ended it early, if anything.
    Benchmarks and tests watch such a loop through a :class:`ConsoleProcess`."""

    def __init__(self, device, loop, console):
        self.device, self.loop, self.console = device, loop, console
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.device:
                self.loop.run(should_stop=self._stop.is_set)
        except BaseException as err:  # noqa: BLE001 - read by whoever runs it
            self.error = err

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        self.console.close()


class LinkPeer:
    """An honest peer on the real console link (:class:`~embodyrl.hal.console.ConsoleLink`) in a
    thread: it answers every command with DONE ok and keeps their actions (``commands``), and
    publishes a status, so the console hears it four times a second. An actor has device 0."""

    def __init__(self, endpoint: str, role: str, actor_id: int = 0, keys=None):
        from ..hal.console import ConsoleLink

        self.link = ConsoleLink(endpoint, role=role, actor_id=actor_id, keys=keys)
        self.commands: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LinkPeer:
        self.link.publish_status({"training": "running"})
        self.link.start([DEVICE] if self.link.role == "actor" else [])
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=10)
            self.link.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for command in self.link.take_commands():
                self.commands.append(command.action)
                self.link.done(command, True)
            time.sleep(0.01)


class RawPeer:
    """A raw DEALER in a thread claiming ``role`` / ``actor_id``, as an attacker would: HELLO every
    ``hello_every_s`` (to win a race), STATUS to stay heard, every COMMAND kept (``commands``) and
    answered DONE ok (``answer``) or not at all; ``forge``: DONE ids sent every 50 ms regardless.
    ``welcomes`` and ``refusals`` are the console's answers."""

    def __init__(self, endpoint: str, role: str, actor_id: int = 0, *, answer: bool = True,
                 hello_every_s: float = 0.2, forge: tuple[str, ...] = ()):
        self.endpoint, self.role, self.actor_id = endpoint, role, actor_id
        self.answer, self.hello_every_s, self.forge = answer, hello_every_s, forge
        self.commands: list[dict] = []
        self.hellos = self.welcomes = 0
        self.refusals: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RawPeer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import zmq

        from ..hal.wire import control
        from ..hal.wire.codec import decode, encode

        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        hello = encode(control.HELLO, {"protocol": control.CONTROL_PROTOCOL, "role": self.role,
                                       "actor_id": self.actor_id, "devices": [DEVICE] if self.role == "actor" else []})
        due = beat = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= due:
                    sock.send_multipart(hello)
                    self.hellos += 1
                    due = now + self.hello_every_s
                if now >= beat:
                    sock.send_multipart(encode(control.STATUS, {"status": {"training": "running"}}))
                    for ident in self.forge:
                        sock.send_multipart(encode(control.DONE, {"id": ident, "ok": True, "error": ""}))
                    beat = now + 0.05
                if sock.poll(10):
                    message = decode(sock.recv_multipart(), control.LIMITS)
                    if message.kind == control.WELCOME:
                        self.welcomes += 1
                    elif message.kind == control.REFUSED:
                        self.refusals.append(str(message.fields.get("reason")))
                    elif message.kind == control.COMMAND:
                        self.commands.append(message.fields)
                        if self.answer:
                            sock.send_multipart(encode(control.DONE, {"id": message.fields["id"], "ok": True,
                                                                      "error": ""}))
        finally:
            sock.close(linger=0)
            context.term()
