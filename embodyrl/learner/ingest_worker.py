"""One ingest worker process: a learner's server and replay shard without the training
(:mod:`.ingest` says how the learner uses it).

``python -m embodyrl.learner.ingest_worker SPEC.json``. The loop is the learner service's own poll
(receive and check, store, group commit, one ACK per actor, credit within the learner's cap), with the
control channel beside it: weights to serve, training calls' shares to sample, priorities to write
back, index claims to ask, and a report of what it took every :data:`REPORT_EVERY_S`.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import zmq

from ..config import TrainConfig, from_dict
from ..hal import params as flat_params
from ..hal.steps import PolicyVersion, Source
from ..hal.wire.codec import DEFAULT_LIMITS, MessageError, decode, encode
from ..hal.wire.security import ServerKeys
from ..transport import LearnerServer
from ..transport.credits import grant_in_turn
from ..transport.publisher import WeightsConfig
from ..transport.server import MAX_BATCH_ROWS, session_limits
from . import ingest as I
from .replay_side import ReplayData
from .service import LearnerService, PolicyAge, WithinBudget

log = logging.getLogger("embodyrl.ingest_worker")

REPORT_EVERY_S = 0.01
"""How often a worker tells the learner what it took (the budget and the ratio see it this late)."""
IDLE_REPORT_S = 0.25
CLAIM_TIMEOUT_S = 10.0


class ShardData(ReplayData):
    """A worker's replay shard: credit within the learner's cap instead of a limiter of its own."""

    cap = 0
    inserted = 0
    """Actors' rows in the shard (what the cap counts)."""

    def add(self, steps, seq: int, actor_id: int) -> int:
        self.inserted += len(steps)
        return super().add(steps, seq, actor_id)

    def grant_credits(self, server) -> None:
        """A quantum to each session holding less than one, in the book's order, within the cap: its
        credit outstanding never exceeds what the cap leaves (the last rows under it in a part quantum,
        at the end of a step budget), as a learner's within its budget (:class:`WithinBudget`)."""
        grant_in_turn(WithinBudget(server, self.cap - self.inserted), self.config.credit_quantum, lambda rows: True)

    def sample_share(self, rows: int, calls: int) -> tuple[dict, dict]:
        """``calls`` batches of ``rows`` rows, stacked ``[calls, rows, ...]``, flat, with their keys."""
        batches = [self.replay.sample(self._rng, rows, self.discount, self.config.n_step, keys=True)
                   for _ in range(calls)]
        keys = {f"keys/{k}": np.stack([b.pop(k) for b in batches]) for k in ("slot", "generation", "source",
                                                                              "probability") if k in batches[0]}
        flats = [flat_params.flatten(b) for b in batches]
        stacked = {name: np.stack([flat[name] for flat in flats]) for name in flats[0]}
        return {**stacked, **keys}, {"stored": self.replay.size}


class PublicationCounts(PolicyAge):
    """A worker's policy ages: the rows each publication acted, counted as the service takes them; the
    learner works out their ages, as only it knows its updates at each publication."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def taken_counts(self, counts, rows, updates: int) -> None:
        self.counts.update(dict(zip(np.asarray(counts).tolist(), np.asarray(rows).tolist(), strict=True)))

    def take(self) -> list[tuple[int, int]]:
        """(publication count, rows) taken since the last call."""
        taken, self.counts = sorted(self.counts.items()), collections.Counter()
        return taken


class RemoteClaims:
    """Index claims asked of the learner, which owns them (a key's indices are the host's, not a shard's);
    a claim granted once is kept (a binding never changes while the learner runs)."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self._requests = iter(range(1, 1 << 62))
        self._granted: set[tuple[str, int]] = set()

    def claim(self, key: str, index: int) -> str | None:
        if (key, index) in self._granted:
            return None
        request = next(self._requests)
        self.worker.send(I.CLAIM, {"key": key, "index": index, "request": request})
        answer = self.worker.wait_for(I.CLAIMED, lambda f: f.get("request") == request, CLAIM_TIMEOUT_S)
        if answer is None:  # the learner is busy (a first compile): unanswered, the link says HELLO again
            raise MessageError("claim_timeout", f"the learner did not answer actor {index}'s claim in "
                                                f"{CLAIM_TIMEOUT_S:g} s")
        reason = answer.get("reason")
        if reason is None:
            self._granted.add((key, index))
            return None
        return str(reason)


class Worker:
    def __init__(self, spec: dict):
        self.spec = spec
        self.shard, self.shards = int(spec["shard"]), int(spec["shards"])
        config = from_dict(TrainConfig, spec["config"])
        self.config = config
        from ..algos.heads import over
        from ..robot import layout_of, reward_bounds_of
        from .build import admission, reward_bound_of

        layout = layout_of(config)
        algorithm = over(config.algo, layout)
        lc = config.learner
        run_dir = Path(spec["run_dir"])
        self.data = ShardData(I.shard_directory(run_dir, self.shard), layout.observation_spec, layout.action_spec,
                              lc, batch_size=algorithm.batch_size, discount=algorithm.discount,
                              seed=config.seed + 104729 * (self.shard + 1), pad=layout.pad_steps)
        self.data.inserted = self.data.replay.store.rows_added  # ever (a ring that wrapped holds fewer)
        keys = spec.get("keys")
        keys = None if keys is None else ServerKeys(Path(keys["secret_key_file"]), Path(keys["authorized_dir"]))
        max_batch_rows = max(MAX_BATCH_ROWS, 2 * (config.actor.send_every + 2))
        from ..hal.wire.protocol import DeviceInfo

        kinds = [DeviceInfo(i, k.name, k.observation_spec, k.action_spec) for i, k in enumerate(layout.kinds)]
        bounds = tuple(reward_bounds_of(config))
        self.server = LearnerServer(spec["bind"], run_id=spec["run_id"], incarnation=int(spec["incarnation"]),
                                    admit=admission(layout), limits=session_limits(kinds, max_batch_rows),
                                    max_batch_rows=max_batch_rows, peer_timeout_s=lc.peer_timeout_s, keys=keys,
                                    allow_insecure=bool(spec["allow_insecure"]),
                                    weights=WeightsConfig(encoding=lc.weights_encoding),
                                    committed_seq=self.data.committed_seq, reward_bound=reward_bound_of(layout, bounds),
                                    incarnations=spec["incarnations"])
        if keys is not None:
            self.server.claims = RemoteClaims(self)
        front = int(spec["front_port"])
        self.server.placement = lambda actor_id: None if actor_id % self.shards == self.shard else front
        self.service = LearnerService(self.server, self.data, None, budget=None, batch_rows=config.actor.send_every,
                                      incarnation=int(spec["incarnation"]), log_every_s=3600.0,
                                      kinds=(layout.names, layout.kind_of))
        self.service.policy_age = PublicationCounts()
        self.control = zmq.Context.instance().socket(zmq.DEALER)
        self.control.setsockopt(zmq.LINGER, 1000)
        self.control.connect(spec["control"])
        self._inbox: collections.deque = collections.deque()
        self._poller = zmq.Poller()
        self._poller.register(self.server.socket, zmq.POLLIN)
        self._poller.register(self.control, zmq.POLLIN)
        self.stop: dict | None = None
        self._reported = 0.0
        self._changed = True

    # -- the control channel -------------------------------------------------------------------------
    def send(self, kind: str, fields: dict, arrays=None) -> None:
        self.control.send_multipart(encode(kind, fields, arrays), copy=False)

    def _receive(self, timeout_ms: int = 0) -> bool:
        if not self.control.poll(timeout_ms, zmq.POLLIN):
            return False
        while True:
            try:
                frames = self.control.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return True
            self._inbox.append(decode(frames, DEFAULT_LIMITS))

    def wait_for(self, kind: str, matches, timeout_s: float) -> dict | None:
        """The fields of the first ``kind`` message ``matches`` accepts (others wait their turn)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in list(self._inbox):
                if msg.kind == kind and matches(msg.fields):
                    self._inbox.remove(msg)
                    return msg.fields
            self._receive(20)
        return None

    def _handle(self) -> None:
        self._receive(0)
        while self._inbox:
            msg = self._inbox.popleft()
            f, counters = msg.fields, self.service.counters
            if msg.kind == I.LIMIT:
                self.data.cap = int(f["cap"])
            elif msg.kind == I.WEIGHTS:
                version = PolicyVersion(*f["version"])
                counters.publications = max(counters.publications, version.count)
                self.server.publish(version, dict(msg.arrays))
            elif msg.kind == I.SAMPLE:
                arrays, fields = self.data.sample_share(int(f["rows"]), int(f["calls"]))
                self.send(I.BATCH, {"call": f["call"], "rows": int(f["rows"]), **fields}, arrays)
            elif msg.kind == I.PRIORITIES:
                self.data.replay.update_priorities(msg.arrays["slot"], msg.arrays["generation"],
                                                   np.asarray(msg.arrays["td_error"], np.float64))
            elif msg.kind == I.STOP:
                self.stop = f

    def report(self, now: float) -> None:
        service, data = self.service, self.data
        counters = service.counters
        record = {"counters": {name: getattr(counters, name) for name in I.COUNTED},
                  "finished": service._returns.take_finished_by_device(),
                  "rates": service._returns.take_intervention_rates(),
                  "lag": service._lag, "policy_counts": service.policy_age.take(),
                  "inserted": data.inserted, "size": data.replay.size, "commits": data.replay.commits,
                  "pending": data.replay.pending_rows, "outstanding": self.server.credits.outstanding(),
                  "sessions": self.server.actor_sessions(), "cpu_s": round(time.process_time(), 4),
                  "by_source": {s.name.lower(): data.replay.group_rows((s,)) for s in Source},
                  "server": self.server.metrics(now)}
        service._lag = []
        self.send(I.STATUS, record)
        self._reported = now

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> int:
        self.send(I.READY, {"shard": self.shard, "token": self.spec["token"], "port": I.port_of(self.server.endpoint),
                            "inserted": self.data.inserted, "size": self.data.replay.size, "outstanding": 0,
                            "sessions": 0})
        parent = int(self.spec["learner_pid"])
        while self.stop is None:
            self._poller.poll(5)
            rows = self.service.poll(0)
            self._handle()
            now = time.monotonic()
            if now - self._reported >= (REPORT_EVERY_S if rows or self._changed else IDLE_REPORT_S):
                self.report(now)
                self._changed = bool(rows)
            if os.getppid() != parent:  # the learner is gone (without PDEATHSIG's help)
                log.error("the learner process is gone: stopping")
                return 1
        error = self.service.shutdown(str(self.stop.get("reason", "learner stopped")),
                                      restart=bool(self.stop.get("restart")))
        self.report(time.monotonic())
        self.control.close(linger=1000)
        return 1 if error is not None else 0


def _die_with_parent() -> None:
    """SIGKILL this process when the learner dies (Linux): a worker never outlives its learner."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    if os.getppid() != spec["learner_pid"]:  # the learner died before the death signal was armed
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for stop in (signal.SIGINT, signal.SIGTERM):  # the learner's to take: it stops its workers in turn
        signal.signal(stop, signal.SIG_IGN)
    worker = Worker(spec)
    log.info("ingest worker %d of %d on %s, shard of %d rows", worker.shard, worker.shards, worker.server.endpoint,
             worker.data.replay.size)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
