"""The robot server's e-stop latches: who set each one, and who may lift it.

Every latch is kept apart, with its setter, so that lifting one never lifts
another (docs/safety.md has the table):

| set by | when | lifted by |
|---|---|---|
| ``admin`` (key, by name) | ESTOP from an admin key | CLEAR from an admin key |
| ``owner`` | ESTOP in the session | CLEAR from the session's owner (with keys: the key that set it) or an admin key |
| ``watchdog`` | no command within ``watchdog_s`` | the owner's CLEAR or RESET, or an admin key's CLEAR |
| ``driver`` | a driver call overran its deadline | nobody: software cannot move a robot through a hung driver |

A CLEAR lifts every latch its sender may lift and is refused (named by the
setter of what remains: ``estop_by_admin``, ``estop_by_owner``,
``driver_hung``) when any is left. Latches belong to the server, not to a
session: they outlive the owner's reconnect, its BYE and a keyless takeover.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

ADMIN, OWNER, WATCHDOG, DRIVER = "admin", "owner", "watchdog", "driver"
_ORDER = (DRIVER, ADMIN, OWNER, WATCHDOG)  # the most binding first: the one a refusal names


@dataclass(frozen=True)
class Latch:
    by: str
    """ADMIN, OWNER, WATCHDOG or DRIVER."""
    key: str | None
    """The CurveZMQ key that set it (an admin's or the owner's); None without keys and for the others."""
    name: str | None
    """That key's name (its file's name in the keys directory)."""
    reason: str
    since: float
    """``time.monotonic()`` when it was set."""

    def setter(self) -> str:
        return {ADMIN: f"admin key {self.name!r}", DRIVER: "a hung driver", WATCHDOG: "the watchdog",
                OWNER: "the session's owner" + ("" if self.name is None else f" (key {self.name!r})")}[self.by]

    def lifted_by(self) -> str:
        return {ADMIN: "only an admin key may clear it",
                OWNER: ("only the session's owner or an admin key may clear it" if self.key is None
                        else f"only key {self.name!r} or an admin key may clear it"),
                WATCHDOG: "the session's owner (CLEAR or RESET) or an admin key may clear it",
                DRIVER: "no software may clear it: check the robot, use its hardware e-stop, restart the server",
                }[self.by]

    def describe(self) -> str:
        return f"e-stop set by {self.setter()} ({self.reason}): {self.lifted_by()}"

    def to_msg(self, now: float) -> dict:
        return {"by": self.by, "name": self.name, "reason": self.reason, "since_s": round(now - self.since, 3)}


class Latches:
    """The set of latched e-stops: one per setter (per key for admins and owners)."""

    def __init__(self):
        self._latches: dict[tuple[str, str | None], Latch] = {}

    def set(self, by: str, reason: str, key: str | None = None, name: str | None = None) -> None:
        """Latch (or re-latch with a newer reason) the e-stop of ``by`` (and ``key``)."""
        if by not in _ORDER:
            raise ValueError(f"unknown e-stop setter {by!r}")
        self._latches[by, key] = Latch(by, key, name, reason, time.monotonic())

    def clear(self, *, admin: bool, key: str | None) -> tuple[list[Latch], list[Latch]]:
        """Lift what a CLEAR from ``key`` may lift (the session owner's, or an admin key's if ``admin``):
        ``(lifted, left)``, each most binding first."""
        lifted, left = [], []
        for latch in self:
            mine = latch.by == WATCHDOG or (latch.by == OWNER and (latch.key is None or latch.key == key))
            (lifted if latch.by != DRIVER and (admin or mine) else left).append(latch)
        for latch in lifted:
            del self._latches[latch.by, latch.key]
        return lifted, left

    def lift_watchdog(self) -> None:
        """The owner's RESET: the watchdog's latch goes (the episode starts afresh)."""
        self._latches.pop((WATCHDOG, None), None)

    def blocking(self) -> list[Latch]:
        """The latches that refuse RESET and STEP alike (all but the watchdog's)."""
        return [latch for latch in self if latch.by != WATCHDOG]

    def has(self, by: str) -> bool:
        return any(latch.by == by for latch in self._latches.values())

    def __iter__(self):
        return iter(sorted(self._latches.values(), key=lambda latch: (_ORDER.index(latch.by), latch.since)))

    def __bool__(self) -> bool:
        return bool(self._latches)

    def summary(self) -> str | None:
        """Every latch's reason, most binding first (None when none is latched)."""
        return "; ".join(latch.reason for latch in self) or None

    def to_msg(self) -> list[dict]:
        now = time.monotonic()
        return [latch.to_msg(now) for latch in self]


def refusal(lifted: list[Latch], left: list[Latch]) -> tuple[str, str]:
    """``(reason, detail)`` of a CLEAR that left ``left`` latched (after lifting ``lifted``)."""
    first = left[0]
    reason = "driver_hung" if first.by == DRIVER else f"estop_by_{first.by}"
    detail = "CLEAR refused: " + "; ".join(latch.describe() for latch in left)
    if lifted:
        detail += "; lifted: " + ", ".join(latch.setter() for latch in lifted)
    return reason, detail
