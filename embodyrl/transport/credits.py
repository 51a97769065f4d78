"""The order in which a learner offers credit to its actors."""

from __future__ import annotations

import itertools


class GrantOrder:
    """Offers credit to the actor holding the least first, then to the one served longest ago.

    With room for one quantum at a time, a fixed order would give every
    quantum to the same actor and starve the rest.
    """

    def __init__(self):
        self._last: dict[bytes, int] = {}  # session identity -> number of its latest grant
        self._grants = itertools.count()

    def order(self, sessions: dict, credit: dict) -> list:
        """``sessions``' items in the order to offer them credit."""
        return sorted(sessions.items(), key=lambda item: (credit.get(item[0], 0), self._last.get(item[0], -1)))

    def granted(self, identity: bytes) -> None:
        self._last[identity] = next(self._grants)

    def forget(self, identity: bytes) -> None:
        self._last.pop(identity, None)
