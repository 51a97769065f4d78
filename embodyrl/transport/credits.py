"""The order in which a learner offers credit to its actors."""

from __future__ import annotations


def fair_order(sessions: dict, credit: dict, last_grant: dict) -> list:
    """``sessions``' items, the actor holding the least credit first, then the one served longest
    ago. With room for one quantum at a time, a fixed order would give every quantum to the same
    actor and starve the rest."""
    return sorted(sessions.items(), key=lambda item: (credit.get(item[0], 0), last_grant.get(item[0], -1)))
