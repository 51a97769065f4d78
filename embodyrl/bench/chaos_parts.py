"""The moving parts the chaos benchmark breaks: a logging actor process, a durable learner side,
and a loopback TCP proxy it can partition.

The actor logs the key (episode id, step index) of every row it hands to its
link, so the benchmark can compare what was produced with what the learner
stored, row by row. Process targets live here (importable) because children
are started with ``spawn``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def in_scratch_dir(prefix: str):
    """Give a scenario a fresh ``work`` directory and remove it when the scenario ends, however it
    ends: its figures are in the record it returns, and a benchmark run in a loop must not fill /tmp.
    ``EMBODYRL_KEEP_SCRATCH=1`` keeps them for debugging."""
    def wrap(scenario):
        @functools.wraps(scenario)
        def run(*args, **kwargs):
            work = Path(tempfile.mkdtemp(prefix=prefix))
            try:
                return scenario(*args, work=work, **kwargs)
            finally:
                if not os.environ.get("EMBODYRL_KEEP_SCRATCH"):
                    shutil.rmtree(work, ignore_errors=True)
        return run
    return wrap


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def row_keys(steps) -> list[tuple[int, int]]:
    return list(zip(steps.episode_id.tolist(), steps.step_index.tolist(), strict=True))


def logged_rows(path) -> list[tuple[int, int]]:
    """The row keys a :func:`logging_actor` handed to its link (a torn last line is skipped)."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rows += [tuple(k) for k in json.loads(line)]
                except json.JSONDecodeError:
                    continue  # killed mid-write: that batch was never handed over completely
    except FileNotFoundError:
        pass
    return rows


def checksum(rows) -> str:
    """Order-independent digest of a multiset of row keys."""
    return hashlib.sha256(np.asarray(sorted(rows), np.int64).tobytes()).hexdigest()[:16]


def logging_actor(endpoint: str, actor_id: int, spool_dir: str, log_path: str, max_steps: int,
                  stop=None, peer_timeout_s: float = 2.0, realtime: bool = False) -> None:
    """A pendulum actor logging every row it hands to the link; drains its spool before exiting."""
    from embodyrl import envs
    from embodyrl.hal.actor import ActorConfig, ActorLoop
    from embodyrl.hal.policy import UniformRandomPolicy
    from embodyrl.hal.wire.client import LearnerLink
    from embodyrl.hal.wire.protocol import DeviceInfo
    from embodyrl.hal.wire.spool import Spool

    device, task = envs.make("pendulum")
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink(endpoint, actor_name=f"chaos-{actor_id}", actor_id=actor_id, devices=[info],
                       handshake_timeout_s=30, peer_timeout_s=peer_timeout_s, reconnect_s=0.2,
                       reconnect_max_s=0.5, spool=Spool(spool_dir))
    original = link.send_steps
    log = open(log_path, "a")  # noqa: SIM115 (open for the life of the process)

    def logged(device_id, steps):
        seq = original(device_id, steps)
        log.write(json.dumps(row_keys(steps)) + "\n")
        log.flush()
        return seq

    link.send_steps = logged
    with device:
        link.connect()
        loop = ActorLoop(device, task, UniformRandomPolicy(device.action_spec, seed=actor_id), link,
                         ActorConfig(actor_id=actor_id, send_every=16, random_steps=10**9, seed=actor_id,
                                     credit_timeout_s=60, realtime=realtime))
        loop.run(max_steps=max_steps, should_stop=(stop.is_set if stop is not None else lambda: False))
        if not link.flush(60):
            raise SystemExit("spool never drained")
        link.close()


class LearnerSide:
    """What a learner keeps across restarts: the rows it committed and each actor's last seq.

    ``delay_s`` makes it a slow learner (it sleeps that long per batch)."""

    def __init__(self, port: int, delay_s: float = 0.0):
        self.port = port
        self.delay_s = delay_s
        self.rows: list[tuple[int, int]] = []
        self.committed: dict[int, int] = {}
        self.incarnation = 0
        self.server = None
        self.max_backlog = 0
        self.resends_dropped = 0

    def start(self):
        from embodyrl.transport import LearnerServer

        self.incarnation += 1
        self.server = LearnerServer(f"tcp://127.0.0.1:{self.port}", run_id="chaos", incarnation=self.incarnation,
                                    committed_seq=lambda actor: self.committed.get(actor, 0), peer_timeout_s=5)

    def crash(self):
        self.server.close()  # no BYE: whatever was in flight is lost
        self.server = None

    def serve(self, seconds: float, accept: bool = True):
        """Receive, store and acknowledge for ``seconds``; ``accept=False`` drops what arrives
        (as if lost in flight): it stays in the actor's spool."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            batches = self.server.poll(20)
            self.max_backlog = max(self.max_backlog, len(batches))
            for b in batches if accept else ():
                if b.seq <= self.committed.get(b.session.actor_id, 0):
                    # a resend racing a reconnect: the server checked the seq at HELLO, before this
                    # poll's batches were stored; drop it as the learner service does
                    self.resends_dropped += 1
                    self.server.ack(b.session, b.seq, credits=len(b.steps))
                    continue
                self.rows += row_keys(b.steps)
                self.committed[b.session.actor_id] = b.seq
                self.server.ack(b.session, b.seq, credits=len(b.steps))
                if self.delay_s:
                    time.sleep(self.delay_s)
            for session in self.server.sessions.values():
                if not getattr(session, "granted", False):
                    self.server.grant(session, 256)
                    session.granted = True

    def serve_until(self, done, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            self.serve(0.2)
        return done()

    def close(self):
        if self.server is not None:
            self.server.close()
            self.server = None


def _pipe(src: socket.socket, dst: socket.socket, partitioned) -> None:
    try:
        while not partitioned.is_set():
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        with contextlib.suppress(OSError):
            s.close()


def tcp_proxy(listen_port: int, target_port: int, partitioned, ready) -> None:
    """Forward loopback TCP from ``listen_port`` to ``target_port``; while ``partitioned`` is set,
    cut every open connection and refuse new ones (accept, then close at once)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(16)
    server.settimeout(0.05)
    open_sockets: list[socket.socket] = []
    ready.set()
    while True:
        if partitioned.is_set():
            for s in open_sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass
            open_sockets.clear()
        try:
            client, _ = server.accept()
        except TimeoutError:
            continue
        if partitioned.is_set():
            client.close()
            continue
        upstream = socket.create_connection(("127.0.0.1", target_port))
        open_sockets += [client, upstream]
        threading.Thread(target=_pipe, args=(client, upstream, partitioned), daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, client, partitioned), daemon=True).start()


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * 4096
    except (FileNotFoundError, ProcessLookupError):
        return 0


def spool_bytes(directory) -> int:
    from pathlib import Path

    return sum(p.stat().st_size for p in Path(directory).glob("*") if p.is_file())
