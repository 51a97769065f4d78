"""Credits: how many rows each actor session may still send, kept in one place.

The learner's server owns one :class:`CreditBook`. Every grant it sends is
entered here (:meth:`LearnerServer.grant <embodyrl.transport.server.LearnerServer.grant>`),
the server enters the rows of every batch a session sends as spent (a resend
or a refused batch too: the actor spent its credit on it), and a session's
holding is forgotten with the session. What to grant is the data side's
choice (a samples-per-insert limit, a PPO iteration's segments, no limit);
:func:`grant_in_turn` is the policy most of them share.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable


class CreditBook:
    """Rows each session holds credit for, and the order in which to offer more.

    Offers go to the session holding the least first, then to the one served
    longest ago: with room for one quantum at a time, a fixed order would give
    every quantum to the same actor and starve the rest.
    """

    def __init__(self):
        self._held: dict[bytes, int] = {}  # session identity -> rows granted, not yet spent
        self._last: dict[bytes, int] = {}  # session identity -> number of its latest grant
        self._grants = itertools.count()

    def held(self, identity: bytes) -> int:
        return self._held.get(identity, 0)

    def outstanding(self) -> int:
        """Rows granted and not yet received, over all sessions (an overspent session counts 0)."""
        return sum(max(v, 0) for v in self._held.values())

    def granted(self, identity: bytes, rows: int) -> None:
        self._held[identity] = self._held.get(identity, 0) + rows
        self._last[identity] = next(self._grants)

    def spent(self, identity: bytes, rows: int) -> None:
        self._held[identity] = self._held.get(identity, 0) - rows

    def forget(self, identity: bytes) -> None:
        self._held.pop(identity, None)
        self._last.pop(identity, None)

    def order(self, sessions: dict) -> list:
        """``sessions``' values in the order to offer them credit (those with devices: a relay's own
        session sends no steps)."""
        return sorted((s for s in sessions.values() if s.devices),
                      key=lambda s: (self.held(s.identity), self._last.get(s.identity, -1)))


def grant_in_turn(server, quantum: int, fits: Callable[[int], bool]) -> None:
    """Give a quantum to each session holding less than one, in the book's order, while
    ``fits(outstanding rows + quantum)`` allows (a rate limit, a bound on rows in flight)."""
    book = server.credits
    for session in book.order(server.sessions):
        if not fits(book.outstanding() + quantum):
            return
        if book.held(session.identity) < quantum:
            server.grant(session, quantum)
