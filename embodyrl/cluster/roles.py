"""The learner and an actor joined through a rendezvous record (:mod:`.rendezvous`), whatever
engine placed them: ``embodyrl learner/actor --rendezvous DIR``, Ray's actors, SLURM's steps."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

from ..hal.wire.security import ClientKeys, ServerKeys
from .rendezvous import LearnerEntry, RayRecord, own_key_pair, public_key_text, wait_for_learner

LEARNER_KEY = "learner"


def with_spools(config, run_dir: Path):
    """``config`` with the actors' spools beside the run (unless it names a place): an actor the
    engine restarts, on any node of a shared filesystem, resends what its spool still holds."""
    import dataclasses

    if config.actor.spool_dir:
        return config
    return dataclasses.replace(config, actor=dataclasses.replace(config.actor, spool_dir=str(Path(run_dir) / "spools")))


def actor_key_name(index: int) -> str:
    return f"actor-{index}"


def advertised(endpoint: str, host: str | None) -> str:
    """``endpoint`` as actors elsewhere dial it: a wildcard bind is replaced by ``host`` (default:
    this node's address as its own name resolves)."""
    url = urlparse(endpoint)
    if url.hostname not in ("0.0.0.0", "*", "::"):
        return endpoint
    host = host or socket.gethostbyname(socket.gethostname())
    return f"tcp://{host}:{url.port}"


def learner_bind(record, bind: str) -> str:
    """Where a (re)started learner listens: on the port its record names, if it has one, so actors
    already dialling it reconnect there; else ``bind``."""
    entry = record.learner()
    if entry is None or not bind.endswith(":*"):
        return bind
    return f"{bind[:-2]}:{urlparse(entry.endpoint).port}"


def learner_keys(run_dir: Path, record) -> ServerKeys:
    """The learner's key pair (made once in ``RUN_DIR/keys``) and the record's actor keys as the
    ones it admits."""
    _, secret = own_key_pair(Path(run_dir) / "keys", LEARNER_KEY)
    return ServerKeys(secret, record.authorized_dir)


def publish(record, learner, run_dir: Path, host: str | None) -> LearnerEntry:
    """Write the learner's entry once it listens."""
    public, _ = own_key_pair(Path(run_dir) / "keys", LEARNER_KEY)
    entry = LearnerEntry(advertised(learner.endpoint, host), public, Path(run_dir).name, learner.incarnation)
    record.publish_learner(entry)
    return entry


class KeySync:
    """For a record that is not files (Ray's store): copy its actor keys into the learner's
    authorised directory every ``period_s`` in a background thread."""

    def __init__(self, record, period_s: float = 0.5):
        self.record, self.period_s = record, period_s
        self._stop = threading.Event()
        self._thread = None
        if isinstance(record, RayRecord):
            record.sync()
            self._thread = threading.Thread(target=self._run, name="embodyrl-keysync", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.record.sync()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def actor_keys(record, index: int, key_dir: Path, timeout_s: float, should_stop=lambda: False
               ) -> tuple[LearnerEntry, ClientKeys]:
    """Actor ``index``'s own key pair (made once on this node, in ``key_dir``), its public key
    added to the record, and the learner's entry and key from it."""
    key_dir = Path(key_dir)
    public, secret = own_key_pair(key_dir, actor_key_name(index))
    record.add_actor_key(actor_key_name(index), public)
    entry = wait_for_learner(record, timeout_s, should_stop)
    server_key = key_dir / f"{LEARNER_KEY}-{entry.run_id}.key"
    server_key.write_text(public_key_text(entry.public_key))
    return entry, ClientKeys(secret, server_key)
