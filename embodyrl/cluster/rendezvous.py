"""One rendezvous record per run: where the learner listens, and which actors may speak to it.

The learner writes its entry (endpoint, CurveZMQ public key, run id, policy incarnation); each
actor makes its own key pair on its own node and adds only its public key. The learner admits
exactly the keys it finds there (its authenticator re-reads them on an unknown key), and actors
find the learner by reading the record, never from an address given to them. No secret key
leaves the node that made it.

Two stores, one interface:

* :class:`FileRecord`: a ``rendezvous/`` directory in the run directory on a shared filesystem
  (SLURM, or one machine): ``learner.json`` written atomically, one ``actors/NAME.key`` public
  key file per actor (each actor writes only its own file, so there is no shared file to race
  on). ``actors/`` is the learner's authorised-keys directory itself.
* :class:`RayRecord`: the same entries in the Ray cluster's key-value store; the learner copies
  the actors' public keys into a local directory it authorises (:meth:`RayRecord.sync`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..hal.wire.security import generate_keys, load_keys

LEARNER_FILE = "learner.json"
ACTORS_DIR = "actors"


@dataclass(frozen=True)
class LearnerEntry:
    endpoint: str
    """Where actors dial (``tcp://HOST:PORT``, with the host actors can reach)."""
    public_key: str
    """The learner's CurveZMQ public key (z85): actors pin it."""
    run_id: str
    incarnation: int
    """The learner's policy incarnation: a restarted learner writes a new one."""


class RendezvousError(RuntimeError):
    pass


def public_key_text(z85: str) -> str:
    """A public key file's contents (ZeroMQ's certificate format) for ``z85``."""
    return f'metadata\ncurve\n    public-key = "{z85}"\n'


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class FileRecord:
    """The record as files in ``directory`` (``RUN_DIR/rendezvous`` on a shared filesystem)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    @property
    def authorized_dir(self) -> Path:
        """The directory of the actors' public keys: the learner's authorised keys."""
        path = self.directory / ACTORS_DIR
        path.mkdir(parents=True, exist_ok=True)
        return path

    def publish_learner(self, entry: LearnerEntry) -> None:
        _write_atomic(self.directory / LEARNER_FILE, json.dumps(asdict(entry)) + "\n")

    def learner(self) -> LearnerEntry | None:
        path = self.directory / LEARNER_FILE
        try:
            return LearnerEntry(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as err:
            raise RendezvousError(f"{path}: not a learner entry ({err})") from None

    def add_actor_key(self, name: str, public_z85: str) -> None:
        _write_atomic(self.authorized_dir / f"{name}.key", public_key_text(public_z85))

    def actor_keys(self) -> dict[str, str]:
        """Actor name -> its public key (z85)."""
        return {path.stem: load_keys(path)[0].decode("ascii") for path in sorted(self.authorized_dir.glob("*.key"))}


class RayRecord:
    """The record in the Ray cluster's key-value store, under ``embodyrl/RUN_ID/``."""

    def __init__(self, run_id: str, local_dir: str | Path | None = None):
        """``local_dir``: where the learner keeps the actors' public keys it authorises."""
        from ray.experimental import internal_kv

        self.run_id, self._kv = run_id, internal_kv
        self._prefix = f"embodyrl/{run_id}/"
        self.local_dir = None if local_dir is None else Path(local_dir)

    @property
    def authorized_dir(self) -> Path:
        self.local_dir.mkdir(parents=True, exist_ok=True)
        return self.local_dir

    def publish_learner(self, entry: LearnerEntry) -> None:
        self._kv._internal_kv_put(self._prefix + LEARNER_FILE, json.dumps(asdict(entry)), overwrite=True)

    def learner(self) -> LearnerEntry | None:
        raw = self._kv._internal_kv_get(self._prefix + LEARNER_FILE)
        return None if raw is None else LearnerEntry(**json.loads(raw))

    def add_actor_key(self, name: str, public_z85: str) -> None:
        self._kv._internal_kv_put(f"{self._prefix}{ACTORS_DIR}/{name}", public_z85, overwrite=True)

    def actor_keys(self) -> dict[str, str]:
        prefix = f"{self._prefix}{ACTORS_DIR}/"
        return {key.decode()[len(prefix):]: self._kv._internal_kv_get(key).decode()
                for key in self._kv._internal_kv_list(prefix)}

    def sync(self) -> int:
        """Copy the record's actor keys into :attr:`authorized_dir`; how many changed."""
        changed = 0
        for name, z85 in self.actor_keys().items():
            path = self.authorized_dir / f"{name}.key"
            text = public_key_text(z85)
            if not path.exists() or path.read_text() != text:
                _write_atomic(path, text)
                changed += 1
        return changed


def own_key_pair(key_dir: str | Path, name: str) -> tuple[str, Path]:
    """(public z85, secret key file) of ``name`` under ``key_dir`` on this node: made once and
    kept, so a restarted process keeps its key."""
    key_dir = Path(key_dir)
    secret = key_dir / f"{name}.key_secret"
    if not secret.exists():
        generate_keys(key_dir, name)
    public, _ = load_keys(secret)
    return public.decode("ascii"), secret


def wait_for_learner(record, timeout_s: float, should_stop: Callable[[], bool] = lambda: False,
                     newer_than: int | None = None) -> LearnerEntry:
    """The learner's entry once it is there (with ``newer_than``: once its incarnation differs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        entry = record.learner()
        if entry is not None and (newer_than is None or entry.incarnation != newer_than):
            return entry
        if should_stop() or time.monotonic() > deadline:
            raise RendezvousError(f"no learner in the rendezvous record within {timeout_s:g} s")
        time.sleep(0.2)
