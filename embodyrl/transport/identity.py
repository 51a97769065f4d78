"""Who may speak as which actor.

With CurveZMQ keys on, a peer's public key is fixed by the handshake and
cannot be forged, so an actor index is bound to a key: :class:`IndexClaims`
says which indices each authorised key may use. ``indices.json`` in the
authorised-keys directory names them (``{"robot-arm": [0, 1]}``, by key file
name); a key it does not name may use one index, bound to it at its first
HELLO and kept in ``bindings_path`` (in the run directory) so that a
restarted learner keeps every binding. :class:`RateLimit` is a token bucket
per key with a global cap, so fresh ZeroMQ identities or reconnect storms
gain nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..hal.wire.security import SecurityError, public_keys

INDICES_FILE = "indices.json"


class IndexClaims:
    """The actor indices each authorised key may use (refusals say which key holds an index)."""

    def __init__(self, authorized_dir: str | Path, bindings_path: str | Path | None = None):
        self.authorized_dir = Path(authorized_dir)
        self.names = public_keys(authorized_dir)  # z85 key -> key file name
        self.bindings_path = None if bindings_path is None else Path(bindings_path)
        self.allowed: dict[str, frozenset[int]] = {}  # key name -> its indices
        named = Path(authorized_dir) / INDICES_FILE
        if named.exists():
            self.allowed = _read_indices(named, set(self.names.values()))
        self.bound: dict[str, int] = {}  # key name -> the one index it took (keys indices.json leaves out)
        if self.bindings_path is not None and self.bindings_path.exists():
            self.bound = {str(k): int(v) for k, v in json.loads(self.bindings_path.read_text()).items()}

    def owner(self, index: int) -> str | None:
        for name, indices in self.allowed.items():
            if index in indices:
                return name
        return next((name for name, i in self.bound.items() if i == index), None)

    def claim(self, key: str, index: int) -> str | None:
        """None if ``key`` may act as actor ``index`` (binding it if it is the key's first claim),
        else the reason to refuse."""
        name = self.names.get(key)
        if name is None:  # CURVE admitted a key added since: a rendezvous record's, or a new robot's
            self.names = public_keys(self.authorized_dir)
            name = self.names.get(key)
        if name is None:  # admitted, then removed
            return "this key is not among the learner's authorised keys"
        if name in self.allowed:
            if index in self.allowed[name]:
                return None
            return f"key {name!r} may act as actor {sorted(self.allowed[name])}, not {index}"
        owner = self.owner(index)
        if owner is not None and owner != name:
            return f"actor index {index} belongs to another key ({owner!r})"
        if name in self.bound:
            if self.bound[name] == index:
                return None
            return (f"key {name!r} acts as actor {self.bound[name]}; give each actor its own key "
                    f"or list its indices in {INDICES_FILE}")
        self.bound[name] = index
        self._save()
        return None

    def _save(self) -> None:
        if self.bindings_path is None:
            return
        tmp = self.bindings_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.bound, sort_keys=True))
        os.replace(tmp, self.bindings_path)


def _read_indices(path: Path, known: set[str]) -> dict[str, frozenset[int]]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SecurityError(f"{path}: not a JSON map of key name -> actor indices ({err})") from None
    if not isinstance(raw, dict):
        raise SecurityError(f"{path}: expected a map of key name -> actor indices")
    allowed, seen = {}, {}
    for name, indices in raw.items():
        if name not in known:
            raise SecurityError(f"{path}: no key file {name}.key in {path.parent}")
        if not isinstance(indices, list) or not all(type(i) is int and i >= 0 for i in indices):
            raise SecurityError(f"{path}: {name}: expected a list of actor indices, got {indices!r}")
        for i in indices:
            if i in seen:
                raise SecurityError(f"{path}: actor index {i} is given to both {seen[i]!r} and {name!r}")
            seen[i] = name
        allowed[name] = frozenset(indices)
    return allowed
