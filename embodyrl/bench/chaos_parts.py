"""The moving parts the chaos benchmark breaks: an actor process with a ledger, a learner side
over the persistent replay, and a loopback TCP proxy it can partition.

Rows are counted at both ends without trusting either side's counters: the
actor's link enters every batch it takes in its ledger (seq, rows, a digest
of the rows' identities; :mod:`embodyrl.hal.ledger`), and the replay on disk
holds what the learner side committed. :func:`exact_once` compares the two,
row by row. Process targets live here (importable) because children are
started with ``spawn``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
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


def bound_when_free(make, seconds: float = 10.0):
    """``make()``, which binds a fixed port, once the port is free: in one process ZeroMQ releases a
    closed socket's port in its I/O thread, a moment after ``close`` returns (a server restarted as
    a new process, as in a run, finds it free)."""
    import zmq

    deadline = time.monotonic() + seconds
    while True:
        try:
            return make()
        except zmq.ZMQError as err:
            if err.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def ledgered(path) -> tuple[int, int]:
    """(rows, newest seq) an actor's ledger names: every batch its link took (0, 0 before any)."""
    from embodyrl.hal.ledger import read_ledger

    entries = read_ledger(path)
    return sum(rows for rows, _ in entries.values()), max(entries, default=0)


class RandomPolicyTakingWeights:
    """Uniform random actions; takes the learner's weights only to act "under" their version,
    so its rows name versions the learner published (as a real policy's do)."""

    def __init__(self, action_spec, seed: int):
        from embodyrl.hal.policy import UniformRandomPolicy

        self._random = UniformRandomPolicy(action_spec, seed=seed)
        self.version = self._random.version

    def act(self, observation, *, explore: bool = True):
        return self._random.act(observation, explore=explore)

    def load_weights(self, version, arrays) -> None:
        self.version = version


def ledger_actor(endpoint: str, actor_id: int, spool_dir: str, ledger_path: str, max_steps: int,
                 stop=None, peer_timeout_s: float = 2.0, realtime: bool = False,
                 key_files: tuple[str, str] | None = None, go=None, stepped=None) -> None:
    """A pendulum actor whose link enters every batch it takes in a :class:`BatchLedger` (the
    link's ``on_sent`` hook, as ``embodyrl actor`` does); a restart on the same spool first adds
    the batches a kill left spooled but not ledgered. Drains its spool before exiting.
    ``key_files``: (own secret key, the learner's public key) for a CurveZMQ link; ``go``: an
    event to wait for (set by the parent) before dialling; ``stepped``: a shared counter of the
    device's steps (:func:`count_steps`)."""
    from embodyrl import envs
    from embodyrl.hal.actor import ActorConfig, ActorLoop
    from embodyrl.hal.ledger import BatchLedger
    from embodyrl.hal.wire.client import LearnerLink
    from embodyrl.hal.wire.protocol import DeviceInfo
    from embodyrl.hal.wire.security import ClientKeys
    from embodyrl.hal.wire.spool import Spool

    device, task = envs.make("pendulum")
    if stepped is not None:
        count_steps(device, stepped)
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    spool, ledger = Spool(spool_dir), BatchLedger(ledger_path)
    ledger.reconcile(spool)
    keys = ClientKeys(*(Path(f) for f in key_files)) if key_files else None
    link = LearnerLink(endpoint, actor_name=f"chaos-{actor_id}", actor_id=actor_id, devices=[info],
                       handshake_timeout_s=30, peer_timeout_s=peer_timeout_s, reconnect_s=0.2,
                       reconnect_max_s=0.5, spool=spool, keys=keys, on_sent=ledger.record)
    if go is not None:
        go.wait()
    with device:
        link.connect()
        loop = ActorLoop(device, task, RandomPolicyTakingWeights(device.action_spec, actor_id), link,
                         ActorConfig(actor_id=actor_id, send_every=16, random_steps=10**9, seed=actor_id,
                                     credit_timeout_s=60, realtime=realtime))
        loop.run(max_steps=max_steps, should_stop=(stop.is_set if stop is not None else lambda: False))
        if not link.flush(60):
            raise SystemExit("spool never drained")
        link.close()
    ledger.close()


def _stored(directory, names: list[str]) -> np.ndarray | None:
    """The columns ``names`` of every row the replay's newest commit holds, read through a
    read-only mapping (as ``embodyrl replay`` reads it); None before any commit."""
    from embodyrl.replay.contents import newest_commit
    from embodyrl.replay.layout import DATA_FILE, META_FILE, Layout
    from embodyrl.replay.ring import ChunkRing

    directory = Path(directory)
    layout = Layout.from_json((directory / META_FILE).read_text(), str(directory / META_FILE))
    ring = ChunkRing(layout.chunks, layout.chunk_rows)
    body = newest_commit(directory)
    if body is None:
        return None
    ring.load(body["ring"])
    data = np.memmap(directory / DATA_FILE, layout.dtype, mode="r", shape=(layout.capacity,))
    parts = [np.array(data[int(c) * layout.chunk_rows:int(c) * layout.chunk_rows + int(ring.fill[c])][names])
             for c in np.flatnonzero(ring.fill)]
    del data
    return np.concatenate(parts) if parts else None


def stored_rows(directory) -> dict[int, np.ndarray]:
    """actor id -> identity columns (device id, episode id, step index) of every row the replay's
    newest commit holds."""
    rows = _stored(directory, ["actor_id", "device_id", "episode_id", "step_index"])
    if rows is None:
        return {}
    ident = np.stack([rows["device_id"].astype(np.int64), rows["episode_id"].astype(np.int64),
                      rows["step_index"].astype(np.int64)], axis=1)
    return {int(a): ident[rows["actor_id"] == a] for a in np.unique(rows["actor_id"])}


def stored_steps(directory, actor_id: int) -> int:
    """Rows of ``actor_id`` in the replay that carry a step (every row but episodes' final ones)."""
    rows = _stored(directory, ["actor_id", "final"])
    return 0 if rows is None else int(np.count_nonzero((rows["actor_id"] == actor_id) & ~rows["final"]))


def count_steps(device, counter) -> None:
    """Count every step the device takes in ``counter`` (a shared value that outlives a SIGKILLed
    actor): what the replay should hold, whatever the actor had batched when it died."""
    step = device.step

    def counted(command):
        observation = step(command)
        counter.value += 1
        return observation

    device.step = counted


def exact_once(ledgers: dict[int, Path], directory) -> dict:
    """Each actor's ledger against the rows the replay holds for it: ``produced`` (ledger rows),
    ``stored``, ``lost`` (produced, never stored), ``duplicated`` (stored more than once),
    ``digest_match`` (the ledger's digest equals the stored rows', per actor)."""
    from embodyrl.hal.ledger import ledger_totals
    from embodyrl.hal.steps import rows_digest

    stored = stored_rows(directory)
    out = {"produced": 0, "stored": 0, "lost": 0, "duplicated": 0, "stored_not_produced": 0, "digest_match": True}
    for actor, path in ledgers.items():
        rows, digest = ledger_totals(path)
        mine = stored.get(actor, np.empty((0, 3), np.int64))
        distinct = len(np.unique(mine, axis=0))
        got = rows_digest({"actor_id": np.full(len(mine), actor), "device_id": mine[:, 0],
                           "episode_id": mine[:, 1], "step_index": mine[:, 2]}) % (1 << 64)
        out["produced"] += rows
        out["stored"] += len(mine)
        out["lost"] += max(rows - distinct, 0)
        out["duplicated"] += len(mine) - distinct
        out["stored_not_produced"] += max(distinct - rows, 0)
        out["digest_match"] &= got == digest
    if not out["digest_match"] and out["lost"] == out["duplicated"] == 0:
        out["lost"] = 1  # equal counts, other rows: some row never arrived and another stands in for it
    return out


CREDIT_QUANTUM = 256
_RUNS = itertools.count()


class LearnerSide:
    """A learner's receiving half, as the learner service runs it, over the persistent replay.

    ``step()`` takes each new batch into the replay (a resend of a batch already taken is dropped),
    starts a group commit when due, acknowledges only what a commit made durable, grants credit in
    turn, heartbeats each second and, with ``publish_every_s``, publishes new weights of
    ``weights_bytes``. What survives :meth:`crash` is the replay directory alone: :meth:`start`
    reopens it and the server resumes each actor's sequence from its last commit. ``delay_s``
    makes it a slow learner (it sleeps that long per batch).
    """

    def __init__(self, port: int, directory: Path, *, delay_s: float = 0.0, keys=None,
                 publish_every_s: float | None = None, weights_bytes: int = 256 << 10,
                 capacity: int = 1 << 20, peer_timeout_s: float = 5.0, commit_interval_s: float = 0.005):
        from embodyrl import envs

        device, _ = envs.make("pendulum")
        self.specs = (device.observation_spec, device.action_spec)
        self.port, self.directory, self.delay_s, self.keys = port, Path(directory), delay_s, keys
        self.publish_every_s, self.weights_bytes, self.capacity = publish_every_s, weights_bytes, capacity
        self.peer_timeout_s, self.commit_interval_s = peer_timeout_s, commit_interval_s
        self.server = self.replay = None
        self.run_id = f"chaos-{os.getpid()}-{next(_RUNS)}"
        """Kept across :meth:`crash` and :meth:`start` (one run, restarted); no two sides share it, so an
        actor left dialling one port that another scenario reuses is refused, not mixed in."""
        self.taken: dict[int, int] = {}
        """actor id -> rows taken into the replay by this object (committed or not; lost in a crash)."""
        self.max_backlog = self.resends_dropped = self.publications = 0
        self.poll_cpu_s = 0.0
        """CPU seconds spent inside ``server.poll`` (waiting for a message costs none): where every
        arriving message is parsed, checked and, if hostile, refused."""

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> None:
        from embodyrl.hal.wire.protocol import DeviceInfo
        from embodyrl.replay import PersistentReplay
        from embodyrl.transport import LearnerServer
        from embodyrl.transport.server import MAX_BATCH_ROWS, session_limits

        self.replay = PersistentReplay(self.directory, *self.specs, capacity=self.capacity, chunk_rows=4096,
                                       write_behind_bytes=256 << 10)
        self.incarnation = time.time_ns() // 1_000_000 % (1 << 40)  # each start is a new learner
        kind = DeviceInfo(0, "pendulum", *self.specs)  # the socket's cap from the specs, as the learner's
        self.server = LearnerServer(self.endpoint, run_id=self.run_id, incarnation=self.incarnation,
                                    limits=session_limits([kind], MAX_BATCH_ROWS),
                                    committed_seq=lambda actor: self.replay.committed_seqs.get(actor, 0),
                                    peer_timeout_s=self.peer_timeout_s, keys=self.keys)
        self._received = self.replay.committed_seqs  # actor id -> newest seq taken
        self._unacked: list = []
        self._cut: list = []  # sessions whose batches were lost in flight, from the first lost on
        self._beat = self._published = time.monotonic()
        self.publications = 0
        if self.publish_every_s is not None:
            self.publish()

    def committed(self) -> dict[int, int]:
        """actor id -> the newest seq the replay holds durably."""
        return self.replay.committed_seqs

    def crash(self) -> None:
        """Stop as a SIGKILL would: no BYE, no final commit; in-flight and uncommitted rows lost."""
        self.server.close()
        self.replay.close(commit=False)
        self.server = self.replay = None

    def publish(self) -> None:
        from embodyrl.hal.steps import PolicyVersion

        self.publications += 1
        weights = {"w": np.random.default_rng(self.publications).standard_normal(self.weights_bytes // 4, np.float32)}
        self.server.publish(PolicyVersion(self.incarnation, self.publications), weights)
        self._published = time.monotonic()

    def step(self, accept: bool = True, timeout_ms: int = 20) -> None:
        """One turn of the loop; ``accept=False`` drops what arrives (as if lost in flight): it
        stays in the actor's spool. A connection loses a suffix of its stream, never a middle, so
        every later batch of a session that lost one is dropped too: taking one would make the
        learner's cumulative acknowledgement cover the batches dropped before it."""
        from embodyrl.transport.credits import grant_in_turn

        cpu0 = time.thread_time()
        batches = self.server.poll(timeout_ms)
        self.poll_cpu_s += time.thread_time() - cpu0
        self.max_backlog = max(self.max_backlog, len(batches))
        for batch in batches:
            if not accept and not self._lost(batch.session):
                self._cut.append(batch.session)
            if not self._lost(batch.session):
                self._take(batch)
        if self.replay.maybe_commit(self.commit_interval_s):
            self._ack()
        grant_in_turn(self.server, CREDIT_QUANTUM, lambda outstanding: True)
        now = time.monotonic()
        if now - self._beat >= 1.0:
            self.server.heartbeat()
            self._beat = now
        if self.publish_every_s is not None and now - self._published >= self.publish_every_s:
            self.publish()

    def _lost(self, session) -> bool:
        return any(cut is session for cut in self._cut)

    def _take(self, batch) -> None:
        session, actor = batch.session, batch.session.actor_id
        self._unacked.append((session, batch.seq))
        if batch.seq <= self._received.get(actor, 0):
            # a resend racing a reconnect (the server checked the seq at HELLO, before this
            # batch was taken): dropped, as the learner service does
            self.resends_dropped += 1
            return
        self._received[actor] = batch.seq
        self.replay.add(batch.steps, seq=batch.seq)
        self.taken[actor] = self.taken.get(actor, 0) + len(batch.steps)
        if self.delay_s:
            time.sleep(self.delay_s)

    def _ack(self) -> None:
        """One cumulative ACK per live session for what the replay holds durably."""
        durable, waiting, newest = self.replay.committed_seqs, [], {}
        for session, seq in self._unacked:
            if seq > durable.get(session.actor_id, 0):
                waiting.append((session, seq))
            elif self.server.sessions.get(session.identity) is session:
                newest[session.identity] = (session, max(seq, newest.get(session.identity, (None, 0))[1]))
        for session, seq in newest.values():
            self.server.ack(session, seq)
        self._unacked = waiting

    def serve(self, seconds: float, accept: bool = True) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.step(accept)

    def serve_until(self, done, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            self.step()
        return done()

    def wait_durable(self, target: dict[int, int], timeout_s: float = 60) -> float:
        """Serve until the replay holds, for every actor, the batches up to ``target[actor]``;
        the seconds it took."""
        start = time.monotonic()
        self.serve_until(lambda: all(self.committed().get(a, 0) >= s for a, s in target.items()), timeout_s)
        return time.monotonic() - start

    def close(self) -> None:
        """Commit and acknowledge what is left, then close (the replay stays on disk)."""
        if self.server is None:
            return
        self.replay.commit()
        self._ack()
        self.server.close()
        self.replay.close()
        self.server = self.replay = None


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


def own_memory_mb() -> tuple[float, float]:
    """(resident, peak resident) MiB of this process, from /proc/self/status."""
    rss = peak = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return rss, peak


def reset_peak_memory() -> float:
    """Start a new peak-RSS window for this process (Linux: ``/proc/self/clear_refs``); the RSS now."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return own_memory_mb()[0]


def spool_bytes(directory) -> int:
    from pathlib import Path

    return sum(p.stat().st_size for p in Path(directory).glob("*") if p.is_file())
