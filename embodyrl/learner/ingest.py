"""Ingest workers: several processes of one learner host take its actors' steps, each into a replay
shard of its own, while the learner process trains.

One process's intake is one core's (docs/scaling.md). With ``learner.ingest_workers N`` the learner
starts N worker processes (:mod:`.ingest_worker`). Worker ``k``:

* binds a port of its own (the learner's port + 1 + k where that port is fixed, else any free one) and
  serves the actors whose index is ``k`` modulo N exactly as a learner serves them: the same
  :class:`~embodyrl.transport.LearnerServer` (keys, limits, checks, exactly-once, acks, credits);
* owns the replay shard ``run_dir/replay/shard-k`` (a :class:`~embodyrl.replay.PersistentReplay`),
  reopened by a resumed learner, and acknowledges only what it committed there;
* asks the learner about index claims (a key's indices stay global) and takes each weight publication
  once from it, serving its actors under the wire's rules (newest once the last is held, deltas,
  checksums);
* reports what it took every few milliseconds (counters, finished episodes, policy versions, rows and
  credit held), and samples its share of each training call when asked.

The learner's own port answers an actor's HELLO with REFUSED naming the actor's ingest port
(``ingest_port``): the link dials that port of the same host, and the learner's endpoint again whenever
its session ends (a worker started again may have another port). Placement is by index, so an actor
always reaches the shard that holds its sequence numbers.

The learner keeps the samples-per-insert limiter and the step budget: it hands each worker a cap on
the rows its actors may have taken plus hold credit for (in credit quanta, the budget's last rows in a
part one), so the ratio and the budget hold over the host as they do in one process. A training call's batch comes from every shard in
proportion to the rows it holds (largest remainder); with priorities, each shard draws by priority
within itself, and the importance weights are worked out over the whole batch from each row's
probability within its shard and the shard's rows (Schaul et al.'s weight for this two-stage draw).

A worker that dies is started again on its shard (its actors dial again and resend what it had not
committed); the learner's death kills its workers (``PR_SET_PDEATHSIG``), and the learner started
again with ``--resume`` reopens every shard. The control channel is a ROUTER on the loopback interface:
a worker proves itself with the token of its spec file (mode 0600), and every message is the wire's
codec (a msgpack header and raw arrays: nothing is unpickled).
"""

from __future__ import annotations

import collections
import hmac
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq

from ..hal.steps import PolicyVersion
from ..hal.wire.codec import DEFAULT_LIMITS, MessageError, decode, encode
from ..replay.layout import META_FILE, SHARDS_FILE
from ..transport import LearnerServer
from ..transport.server import BYE_WAIT_S

log = logging.getLogger(__name__)

# worker -> learner
READY, STATUS, BATCH, CLAIM = "READY", "STATUS", "BATCH", "CLAIM"
# learner -> worker
LIMIT, WEIGHTS, SAMPLE, PRIORITIES, CLAIMED, STOP = "LIMIT", "WEIGHTS", "SAMPLE", "PRIORITIES", "CLAIMED", "STOP"

COUNTED = ("rows", "env_steps", "episodes", "rows_behind", "discarded")
"""The service's counters a worker reports, cumulative since it started."""
READY_TIMEOUT_S = 120.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def shard_directory(run_dir: Path, shard: int) -> Path:
    return Path(run_dir) / "replay" / f"shard-{shard}"


def claim_shards(run_dir: Path, count: int) -> None:
    """Record that ``run_dir``'s replay is ``count`` shards, or refuse a run written otherwise (its
    actors' sequence numbers live in the shards their indices chose)."""
    replay = Path(run_dir) / "replay"
    record = replay / SHARDS_FILE
    if record.exists():
        written = json.loads(record.read_text())["shards"]
        if written != count:
            raise ValueError(f"learner.ingest_workers: {replay} holds {written} shards; resume it with "
                             f"learner.ingest_workers {written}")
        return
    if (replay / META_FILE).exists():
        raise ValueError(f"learner.ingest_workers: {replay} is one replay written without ingest workers; "
                         "resume it with learner.ingest_workers 0")
    replay.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"shards": count}) + "\n")


def worker_bind(bind: str, shard: int) -> str:
    """Worker ``shard``'s address: the learner's host, its port + 1 + shard where that is fixed."""
    match = re.fullmatch(r"tcp://(.+):(\d+|\*)", bind)
    if match is None:
        raise ValueError(f"learner.ingest_workers: the learner binds {bind!r}; ingest workers need a TCP address")
    host, port = match.groups()
    return f"tcp://{host}:{'*' if port == '*' else int(port) + 1 + shard}"


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


@dataclass
class Worker:
    """One ingest worker as the learner sees it."""

    shard: int
    spec_path: Path
    log_path: Path
    process: subprocess.Popen | None = None
    identity: bytes | None = None
    port: int | None = None
    ready: bool = False
    starts: int = 0
    status: dict = field(default_factory=dict)
    """Its newest report's fields."""
    counted: dict = field(default_factory=dict)
    """Its cumulative counters as far as the learner has counted them."""
    cap: int = -1
    """The rows its actors may have taken plus hold credit for (the last LIMIT sent)."""
    exits: list = field(default_factory=list)
    """When its process ended lately (monotonic seconds)."""

    @property
    def inserted(self) -> int:
        return int(self.status.get("inserted", 0))

    @property
    def outstanding(self) -> int:
        return int(self.status.get("outstanding", 0))

    @property
    def sessions(self) -> int:
        return int(self.status.get("sessions", 0))

    @property
    def size(self) -> int:
        return int(self.status.get("size", 0))


@dataclass
class Taken:
    """What the workers took since the last look: counter increments, finished episodes (device id,
    return), intervention rates, policy lags and rows by the publication that acted them."""

    counters: dict = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    finished: list = field(default_factory=list)
    rates: list = field(default_factory=list)
    lag: list = field(default_factory=list)
    policy_counts: collections.Counter = field(default_factory=collections.Counter)


class IngestWorkers:
    """The learner's side of its ingest workers: their processes (started, watched, started again), the
    control channel, and what they report."""

    def __init__(self, run_dir: Path, count: int, config: dict, *, bind: str, keys=None,
                 allow_insecure: bool = False, incarnation: int, incarnations=()):
        self.run_dir, self.count = Path(run_dir), count
        claim_shards(self.run_dir, count)
        self.token = secrets.token_hex(16)
        self._context = zmq.Context.instance()
        self._control = self._context.socket(zmq.ROUTER)
        self._control.setsockopt(zmq.LINGER, 0)
        self._control.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._control.setsockopt(zmq.MAXMSGSIZE, DEFAULT_LIMITS.max_message_bytes + DEFAULT_LIMITS.max_header_bytes)
        self._control.bind("tcp://127.0.0.1:*")
        self.control_endpoint = self._control.getsockopt_string(zmq.LAST_ENDPOINT)
        self.claims = None
        """The learner's :class:`~embodyrl.transport.identity.IndexClaims` (set by :class:`FrontServer`)."""
        self.batches: dict[tuple[int, int], tuple[dict, dict]] = {}  # (call, shard) -> (fields, arrays)
        self.taken = Taken()
        self.unknown_messages = 0
        self._weights: tuple | None = None  # the newest publication: a worker started again gets it
        self.restarts = 0
        self.stopped = False
        folder = self.run_dir / "ingest"
        folder.mkdir(parents=True, exist_ok=True)
        self.workers = [Worker(k, folder / f"worker-{k}.json", folder / f"worker-{k}.log") for k in range(count)]
        spec = {"run_dir": str(self.run_dir), "run_id": self.run_dir.name, "shards": count, "config": config,
                "control": self.control_endpoint, "token": self.token, "front_port": None,
                "keys": None if keys is None else {"secret_key_file": str(keys.secret_key_file),
                                                    "authorized_dir": str(keys.authorized_dir)},
                "allow_insecure": allow_insecure, "incarnation": incarnation, "incarnations": sorted(incarnations),
                "learner_pid": os.getpid()}
        self._spec, self._bind = spec, bind

    # -- processes -------------------------------------------------------------------------------------
    def start(self, front_port: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start every worker and wait for each to say it is ready (RuntimeError, with its log, if one dies)."""
        self._spec["front_port"] = front_port
        for worker in self.workers:
            self._spawn(worker)
        deadline = time.monotonic() + timeout_s
        while not all(w.ready for w in self.workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"ingest workers not ready within {timeout_s:g} s: "
                                   + "; ".join(self._tail(w) for w in self.workers if not w.ready))
            for worker in self.workers:
                if worker.process.poll() is not None:
                    raise RuntimeError(f"ingest worker {worker.shard} exited with {worker.process.returncode}: "
                                       f"{self._tail(worker)}")
            self.pump(50)

    def _spawn(self, worker: Worker) -> None:
        spec = {**self._spec, "shard": worker.shard, "bind": worker_bind(self._bind, worker.shard)}
        fd = os.open(worker.spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the token
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}  # the accelerator is the learner's
        with worker.log_path.open("a") as out:
            worker.process = subprocess.Popen([sys.executable, "-m", "embodyrl.learner.ingest_worker",
                                               str(worker.spec_path)], stdout=out, stderr=subprocess.STDOUT, env=env)
        # its last report's rows and credit stand until it reports again (the limiter counts them)
        worker.ready, worker.identity, worker.counted, worker.cap = False, None, {}, -1
        worker.starts += 1

    def _tail(self, worker: Worker) -> str:
        try:
            lines = worker.log_path.read_text().strip().splitlines()
        except OSError:
            lines = []
        return f"worker {worker.shard} ({worker.log_path}): " + (" | ".join(lines[-5:]) or "no output")

    def supervise(self) -> list[int]:
        """Start again every worker whose process ended while the learner runs; the shards restarted.
        One that ends :data:`MAX_RESTARTS` times within :data:`RESTART_WINDOW_S` stops the learner
        (RuntimeError with its log): it fails the same way each time (its port taken, its shard unreadable)."""
        restarted = []
        for worker in self.workers:
            if not self.stopped and worker.process is not None and worker.process.poll() is not None:
                now = time.monotonic()
                worker.exits = [t for t in worker.exits if now - t < RESTART_WINDOW_S] + [now]
                if len(worker.exits) > MAX_RESTARTS:
                    raise RuntimeError(f"ingest worker {worker.shard} exited {len(worker.exits)} times within "
                                       f"{RESTART_WINDOW_S:g} s: {self._tail(worker)}")
                log.warning("ingest worker %d exited with %s; starting it again on its shard (%s)", worker.shard,
                            worker.process.returncode, self._tail(worker))
                self._spawn(worker)
                self.restarts += 1
                restarted.append(worker.shard)
        return restarted

    def describe(self) -> str:
        """The workers not ready, with their logs' last lines."""
        return "; ".join(self._tail(w) for w in self.workers if not w.ready) or "all ready"

    def stop(self, reason: str, restart: bool, timeout_s: float = 30.0) -> None:
        """Have every worker say goodbye to its actors, commit and exit; kill one that does not."""
        self.stopped = True
        for worker in self.workers:
            if worker.ready:
                self.send(worker, STOP, {"reason": reason, "restart": restart})
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            if worker.process is None:
                continue
            while worker.process.poll() is None and time.monotonic() < deadline:
                self.pump(20)
            if worker.process.poll() is None:
                log.warning("ingest worker %d did not stop within %g s: killed", worker.shard, timeout_s)
                worker.process.kill()
                worker.process.wait()
        self.pump(0)  # their last reports

    def close(self) -> None:
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()
        self._control.close(linger=0)

    # -- the control channel -------------------------------------------------------------------------
    @property
    def socket(self) -> zmq.Socket:
        return self._control

    def send(self, worker: Worker, kind: str, fields: dict, arrays: Mapping[str, np.ndarray] | None = None) -> bool:
        if worker.identity is None:
            return False
        try:
            self._control.send_multipart([worker.identity, *encode(kind, fields, arrays)], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # gone: supervise() starts it again
            return False
        return True

    def pump(self, timeout_ms: int = 0) -> None:
        """Handle what the workers sent (waiting at most ``timeout_ms`` for the first message)."""
        if not self._control.poll(timeout_ms, zmq.POLLIN):
            return
        for _ in range(1024):
            try:
                frames = self._control.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = frames[0].bytes
            try:
                msg = decode(frames[1:], DEFAULT_LIMITS)
                self._handle(identity, msg)
            except (MessageError, KeyError, TypeError, ValueError) as err:
                self.unknown_messages += 1
                log.debug("ingest control: dropped a message (%s)", err)

    def _handle(self, identity: bytes, msg) -> None:
        f = msg.fields
        if msg.kind == READY:
            shard = f["shard"]
            if type(shard) is not int or not 0 <= shard < self.count or \
                    not hmac.compare_digest(str(f.get("token", "")), self.token):
                raise ValueError("READY without this learner's token")
            worker = self.workers[shard]
            worker.identity, worker.port, worker.ready, worker.status = identity, int(f["port"]), True, dict(f)
            worker.counted = {}
            if self.stopped:  # ready after the learner began to stop: it stops too
                self.send(worker, STOP, {"reason": "learner stopped", "restart": True})
            elif self._weights is not None:
                self.send(worker, WEIGHTS, *self._weights)
            return
        worker = next((w for w in self.workers if w.identity == identity and w.ready), None)
        if worker is None:
            raise ValueError(f"{msg.kind} from a peer that is no worker of this learner")
        if msg.kind == STATUS:
            self._count(worker, f)
        elif msg.kind == BATCH:
            self.batches[(int(f["call"]), worker.shard)] = (f, dict(msg.arrays))
        elif msg.kind == CLAIM:
            reason = None if self.claims is None else self.claims.claim(str(f["key"]), int(f["index"]))
            self.send(worker, CLAIMED, {"request": f["request"], "reason": reason})
        else:
            raise ValueError(f"unexpected {msg.kind!r} from ingest worker {worker.shard}")

    def _count(self, worker: Worker, f: dict) -> None:
        worker.status = dict(f)
        taken = self.taken
        for name in COUNTED:
            now = int(f["counters"][name])
            taken.counters[name] += now - worker.counted.get(name, 0)
            worker.counted[name] = now
        taken.finished.extend((int(d), float(r)) for d, r in f["finished"])
        taken.rates.extend(float(r) for r in f["rates"])
        taken.lag.extend(float(x) for x in f["lag"])
        for count, rows in f["policy_counts"]:
            taken.policy_counts[int(count)] += int(rows)

    def take(self) -> Taken:
        """What the workers reported taking since the last call."""
        taken, self.taken = self.taken, Taken()
        return taken

    @property
    def ready(self) -> list[Worker]:
        return [w for w in self.workers if w.ready]

    def publish(self, version: PolicyVersion, arrays: Mapping[str, np.ndarray]) -> None:
        self._weights = ({"version": list(version)}, arrays)
        for worker in self.ready:
            self.send(worker, WEIGHTS, *self._weights)


class FrontServer(LearnerServer):
    """The learner's own port with ingest workers: a HELLO is told its actor's ingest port (a relay's
    own session stays: it takes weights here); publications and goodbyes go to the workers too, and
    the metrics are the host's."""

    def __init__(self, *args, workers: IngestWorkers, **kwargs):
        super().__init__(*args, **kwargs)
        self.workers = workers
        workers.claims = self.claims
        self.placement = self._placement
        self._poller = zmq.Poller()
        self._poller.register(self.socket, zmq.POLLIN)
        self._poller.register(workers.socket, zmq.POLLIN)

    def _placement(self, actor_id: int) -> int | None:
        worker = self.workers.workers[actor_id % self.workers.count]
        return worker.port if worker.ready else 0

    def poll(self, timeout_ms: int = 0, max_messages: int = 256):
        """The workers' reports and the learner's own port: whichever speaks first ends the wait."""
        if timeout_ms:
            self._poller.poll(timeout_ms)
        self.workers.pump(0)
        self.workers.supervise()
        return super().poll(0, max_messages)

    def publish(self, version: PolicyVersion, arrays: dict[str, np.ndarray]) -> None:
        super().publish(version, arrays)
        self.workers.publish(version, arrays)

    def actor_sessions(self) -> int:
        return super().actor_sessions() + sum(w.sessions for w in self.workers.ready)

    @property
    def ingest_ports(self) -> list[int | None]:
        """Each worker's port, by shard (the learner's endpoint record lists them)."""
        return [w.port for w in self.workers.workers]

    def bye(self, reason: str, wait_s: float = BYE_WAIT_S, *, restart: bool = False) -> None:
        self.workers.stop(reason, restart)
        super().bye(reason, wait_s, restart=restart)

    def close(self) -> None:
        super().close()
        self.workers.close()

    def metrics(self, now: float) -> dict:
        """The host's traffic and refusals: this port's and every worker's last report."""
        record = super().metrics(now)
        for worker in self.workers.workers:
            server = worker.status.get("server", {})
            for key in ("messages_in", "bytes_in", "messages_out", "bytes_out", "duplicates_dropped", "seq_gaps"):
                record[key] += int(server.get(key, 0))
            for reason, n in server.get("rejected_by_reason", {}).items():
                record["rejected_by_reason"][reason] = record["rejected_by_reason"].get(reason, 0) + int(n)
            record["last_refusal"].update(server.get("last_refusal", {}))
        record["rejected"] = sum(record["rejected_by_reason"].values())
        record["actors"] = self.actor_sessions()
        record["ingest_workers"] = [{"shard": w.shard, "port": w.port, "ready": w.ready, "starts": w.starts,
                                     "sessions": w.sessions, "rows": w.size, "cpu_s": w.status.get("cpu_s")}
                                    for w in self.workers.workers]
        return record


def ingest_spec(config) -> dict:
    """The training config as a worker rebuilds it (written in its JSON spec)."""
    from ..config import to_dict

    return to_dict(config)
