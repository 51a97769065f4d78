"""Who may speak as which peer at the console's control endpoint.

A HELLO names a role and an actor id; nothing in it is proof. The console
binds each id (and the learner's one place) to what the peer cannot forge:

* with CurveZMQ keys, its key, by the learner's own rules
  (:class:`~embodyrl.transport.identity.IndexClaims`: ``indices.json``, else
  a key's first id, kept in ``bindings_path``); the learner's place is index
  :data:`LEARNER_INDEX` among them, which no robot's key may hold;
* without keys, its connection: a second claimant is refused while the
  holder has been heard within :data:`HELD_FOR_S`, and may retry; after
  that (a restarted actor) it takes the id over.

A refusal names the id and its holder, so an operator reading an actor's
log knows which process to stop.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..hal.wire.control import STATUS_EVERY_S
from ..transport.identity import IndexClaims

LEARNER_INDEX = -1
"""The learner's place among a key's indices (actors' ids are >= 0, as at the learner)."""
HELD_FOR_S = 3 * STATUS_EVERY_S
"""Without keys, a holder heard within this long keeps its id against other connections."""


class Refused(Exception):
    """A claim the console refuses: ``reason`` names the id and its holder; ``retry_after_s`` is
    set when the claim may pass later (the holder may be a predecessor that died)."""

    def __init__(self, reason: str, retry_after_s: float | None = None):
        super().__init__(reason)
        self.reason, self.retry_after_s = reason, retry_after_s


def connection_name(identity: bytes, address: str | None) -> str:
    """How the page names a peer without keys: its address and its connection's routing id."""
    return f"connection {address or '?'} #{identity.hex()}"


class Claims:
    """Decides each HELLO's claim; ``authorized_dir`` None: no keys, connections only."""

    def __init__(self, authorized_dir: str | Path | None = None, bindings_path: str | Path | None = None):
        self.keys = IndexClaims(authorized_dir, bindings_path) if authorized_dir is not None else None

    def key_name(self, key: str | None) -> str | None:
        return None if self.keys is None or key is None else self.keys.names.get(key)

    def check(self, holder, identity: bytes, key: str | None, role: str, actor_id: int) -> None:
        """Refused unless this connection (``key``: its CurveZMQ key) may speak as ``role`` /
        ``actor_id``; ``holder`` is the :class:`~.state.Peer` holding it now, or None."""
        what = "the learner" if role == "learner" else f"actor {actor_id}"
        if self.keys is not None:
            if key is None:
                raise Refused(f"{what}: this connection has no CurveZMQ key")
            reason = self.keys.claim(key, LEARNER_INDEX if role == "learner" else actor_id)
            if reason is not None:
                if role == "learner":
                    owner = self.keys.owner(LEARNER_INDEX)
                    reason = f"key {self.key_name(key)!r} may not act as the learner" + (
                        f" (key {owner!r} does)" if owner is not None else "")
                raise Refused(f"{what} refused: {reason}")
            return
        if holder is None or holder.identity == identity:
            return
        quiet = time.monotonic() - holder.last_seen
        if quiet < HELD_FOR_S:
            raise Refused(f"{what} is held by {holder.who} (heard {quiet:.2f} s ago): give each actor its own "
                          f"id; a restarted one gets it {HELD_FOR_S:g} s after its predecessor falls silent",
                          retry_after_s=HELD_FOR_S - quiet)
