"""``embodyrl console`` as a child process on free ports: for benchmarks, tests and scripts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConsoleProcess:
    """``embodyrl console RUN_DIR ARGS...`` until the ``with`` block ends; ``url``, ``control``
    (the endpoint peers dial) and, off loopback, the ``token`` it printed."""

    def __init__(self, run_dir: str | Path, *args: str, bind_host: str = "127.0.0.1"):
        self.port, control_port = free_port(), free_port()
        self.control = f"tcp://127.0.0.1:{control_port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "embodyrl.cli", "console", str(run_dir),
                        "--bind", f"{bind_host}:{self.port}", "--control", self.control, *args]
        self.process: subprocess.Popen | None = None
        self.token: str | None = None

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
