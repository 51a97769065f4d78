"""What the console knows: its peers, their latest status and frames, the curves, the actions.

Everything a peer sends is untrusted: :func:`_clean` keeps only JSON-able
scalars, lists and maps of bounded size, and the state holds at most
:data:`MAX_ACTORS` actors and :data:`MAX_STATE_BYTES` of what peers declare
and report (a HELLO past either is refused by name, a status past it
dropped and shown as dropped; a silent actor gives its place up first), so
a flood of peers cannot make the page or the log hold what it should not.
Who may hold which id is :mod:`.identity`'s to say.
:meth:`ConsoleState.snapshot` is the page's state object (see
``docs/console.md``); a finished run is loaded from its ``metrics.jsonl``
(:meth:`ConsoleState.load_metrics`).
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..runlog import CONSOLE, is_learner_record
from .identity import Refused

CONNECTED_WITHIN_S = 5.0
"""A peer heard from within this long is connected (peers say something at least every 2 s)."""
MAX_POINTS = 1000
"""Curve points sent to the page (a longer run is thinned evenly)."""
MAX_KEPT_POINTS = 20 * MAX_POINTS
"""Curve points kept (past it, every other one is dropped)."""
MAX_ACTIONS = 50
MAX_ACTORS = 256
MAX_STATE_BYTES = 4 << 20
"""What all peers together may add to the page's state: their devices as shown, and statuses."""
MAX_DECLARED_BYTES = 32 << 10
"""What one HELLO's devices may add (:func:`_declared_bytes`)."""
MAX_STATUS_BYTES = 64 << 10
"""One peer's status, as JSON."""
MAX_PEER_FRAME_BYTES = 8 << 20
MAX_FRAME_BYTES = 128 << 20
"""The newest JPEGs kept: per peer, and in all."""
DEVICE_VIEW_BYTES, CAMERA_VIEW_BYTES = 400, 100
"""About what each device and camera adds to the page's state beyond what the HELLO names."""


def _clean(value, depth: int = 0):
    """A JSON-able copy of what a peer sent: scalars, strings up to 500 characters, lists and maps
    of up to 64 entries, 4 levels deep; anything else becomes None."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**62 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value[:500]
    if depth >= 4:
        return None
    if isinstance(value, dict):
        return {str(k)[:64]: _clean(v, depth + 1) for k, v in list(value.items())[:64]}
    if isinstance(value, (list, tuple)):
        return [_clean(v, depth + 1) for v in value[:64]]
    return None


def _declared_bytes(devices: list[dict]) -> int:
    """What a peer's devices add to the page's state, about."""
    cameras = sum(len(d["cameras"]) for d in devices)
    return len(json.dumps(devices)) + DEVICE_VIEW_BYTES * len(devices) + CAMERA_VIEW_BYTES * cameras


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class Frame:
    seq: int
    jpeg: bytes
    width: int
    height: int
    received: float


@dataclass
class Peer:
    """One actor or the learner, as last heard."""

    identity: bytes
    role: str
    actor_id: int
    devices: list[dict]
    last_seen: float
    who: str = ""
    """Its key's name with keys, else its connection (the page shows it)."""
    status: dict = field(default_factory=dict)
    frames: dict[tuple[int, str], Frame] = field(default_factory=dict)
    declared_bytes: int = 0
    status_bytes: int = 0
    status_error: str = ""

    @property
    def weight(self) -> int:
        return self.declared_bytes + self.status_bytes

    @property
    def connected(self) -> bool:
        return time.monotonic() - self.last_seen < CONNECTED_WITHIN_S

    def name(self) -> str:
        return "the learner" if self.role == "learner" else f"actor {self.actor_id}"


@dataclass
class Action:
    """One request of the operator's and what became of it."""

    id: str
    time: float
    origin: str
    action: str
    target: str
    status: str = "pending"
    error: str = ""
    ms: float | None = None
    received: float = field(default_factory=time.monotonic)
    results: list[dict] = field(default_factory=list)

    def entry(self) -> dict:
        applied = [r["applied_ms"] for r in self.results if r.get("applied_ms") is not None]
        return {"id": self.id, "time": self.time, "origin": self.origin, "action": self.action,
                "target": self.target, "status": self.status, "error": self.error, "ms": self.ms,
                "applied_ms": max(applied) if applied else None}


class ConsoleState:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.learner: Peer | None = None
        self.actors: dict[int, Peer] = {}
        self.learner_record: dict = {}
        self.points: list[dict] = []
        """Curve points against env steps: episode_return, success_rate, intervention_rate, losses."""
        self.actions: deque[Action] = deque(maxlen=MAX_ACTIONS)
        self.weight = 0
        """What the peers add to the page's state, together (at most :data:`MAX_STATE_BYTES`)."""
        self.frame_bytes = 0
        self.admin_robots: list[dict] = []
        """The robot servers the console's admin key reaches, by actor and device (:mod:`.admin`)."""
        self._by_identity: dict[bytes, Peer] = {}
        self._judged: tuple[int, int] = (0, 0)  # successes, judged: over every actor, at the last point

    # -- peers -----------------------------------------------------------------
    def peer(self, identity: bytes) -> Peer | None:
        return self._by_identity.get(identity)

    def holder(self, role: str, actor_id: int) -> Peer | None:
        return self.learner if role == "learner" else self.actors.get(actor_id)

    def hello(self, identity: bytes, role: str, actor_id: int, devices: list[dict], who: str = "") -> Peer:
        """A peer said HELLO, its claim checked: known again, or in the place of the one it replaces
        (a restarted peer). :class:`~.identity.Refused` past a cap."""
        what = "the learner" if role == "learner" else f"actor {actor_id}"
        declared = _declared_bytes(devices)
        if declared > MAX_DECLARED_BYTES:
            raise Refused(f"{what} refused: its devices come to {declared} bytes on the page, at most "
                          f"{MAX_DECLARED_BYTES} (fewer devices or cameras, or shorter names)")
        known = self.holder(role, actor_id)
        if known is not None and known.identity == identity:
            if not self._make_room(declared - known.declared_bytes, new_actor=False):
                raise Refused(f"{what} refused: the console's state is full ({MAX_STATE_BYTES} bytes)")
            self.weight += declared - known.declared_bytes
            known.last_seen, known.devices, known.declared_bytes = time.monotonic(), devices, declared
            return known
        if known is not None:
            self._drop(known)
        if not self._make_room(declared, new_actor=role == "actor"):
            if role == "actor" and len(self.actors) >= MAX_ACTORS:
                raise Refused(f"{what} refused: the console holds {MAX_ACTORS} actors, its most, all heard "
                              f"within {CONNECTED_WITHIN_S:g} s")
            raise Refused(f"{what} refused: the console's state is full ({MAX_STATE_BYTES} bytes of peers' "
                          "devices and statuses)")
        peer = Peer(identity, role, actor_id, devices, time.monotonic(), who=who, declared_bytes=declared)
        if role == "learner":
            self.learner = peer
        else:
            self.actors[actor_id] = peer
        self._by_identity[identity] = peer
        self.weight += declared
        return peer

    def _make_room(self, weight: int, new_actor: bool) -> bool:
        """Whether ``weight`` more bytes (and a new actor's place) fit, once silent actors, the
        longest silent first, have given theirs up."""
        while (new_actor and len(self.actors) >= MAX_ACTORS) or self.weight + weight > MAX_STATE_BYTES:
            silent = [p for p in self.actors.values() if not p.connected]
            if not silent:
                return False
            self._drop(min(silent, key=lambda p: p.last_seen))
        return True

    def _drop(self, peer: Peer) -> None:
        if peer.role == "learner":
            self.learner = None
        else:
            self.actors.pop(peer.actor_id, None)
        self._by_identity.pop(peer.identity, None)
        self.weight -= peer.weight
        self.frame_bytes -= sum(len(f.jpeg) for f in peer.frames.values())

    def status(self, peer: Peer, status: dict) -> None:
        peer.last_seen = time.monotonic()
        cleaned = _clean(status) if isinstance(status, dict) else {}
        size = len(json.dumps(cleaned))
        if size > MAX_STATUS_BYTES or self.weight - peer.status_bytes + size > MAX_STATE_BYTES:
            peer.status_error = (f"a status of {size} bytes was dropped (at most {MAX_STATUS_BYTES} a peer, "
                                 f"{MAX_STATE_BYTES} in all)")
            return
        self.weight += size - peer.status_bytes
        peer.status, peer.status_bytes, peer.status_error = cleaned, size, ""

    def frame(self, peer: Peer, device_id: int, name: str, seq: int, jpeg: bytes, width: int, height: int) -> bool:
        """Keep a camera's newest frame; False (dropped) past :data:`MAX_PEER_FRAME_BYTES` or
        :data:`MAX_FRAME_BYTES`."""
        peer.last_seen = time.monotonic()
        old = peer.frames.get((device_id, name))
        grows = len(jpeg) - (len(old.jpeg) if old is not None else 0)
        if (self.frame_bytes + grows > MAX_FRAME_BYTES
                or sum(len(f.jpeg) for f in peer.frames.values()) + grows > MAX_PEER_FRAME_BYTES):
            return False
        peer.frames[(device_id, name)] = Frame(seq, jpeg, width, height, time.monotonic())
        self.frame_bytes += grows
        return True

    def metrics(self, peer: Peer, record: dict) -> dict | None:
        """A learner's metrics record: a curve point (with the actors' success rate since the last
        one); returns the console's own row for ``metrics.jsonl`` when it has a success rate."""
        peer.last_seen = time.monotonic()
        record = _clean(record) if isinstance(record, dict) else {}
        self.learner_record = record
        success = self._success_rate()
        self._add_point(record, success)
        if success is None or _number(record.get("env_steps")) is None:
            return None
        return {"source": CONSOLE, "time": round(time.time(), 3), "env_steps": record["env_steps"],
                "success_rate": success}

    def _success_rate(self) -> float | None:
        """Successes over episodes judged, every actor, since the last curve point."""
        successes = sum(int(_number(p.status.get("successes")) or 0) for p in self.actors.values())
        judged = sum(int(_number(p.status.get("judged")) or 0) for p in self.actors.values())
        before_s, before_j = self._judged
        self._judged = (successes, judged)
        if judged <= before_j or successes < before_s:
            return None
        return min(1.0, (successes - before_s) / (judged - before_j))

    def _add_point(self, record: dict, success: float | None) -> None:
        steps = _number(record.get("env_steps"))
        if steps is None:
            return
        point = {"env_steps": steps, "episode_return": _number(record.get("episode_return")),
                 "success_rate": success if success is not None else _number(record.get("success_rate")),
                 "intervention_rate": _number(record.get("intervention_rate"))}
        point.update({k: _number(v) for k, v in record.items() if "loss" in k and _number(v) is not None})
        self.points.append(point)
        if len(self.points) > MAX_KEPT_POINTS:
            self.points = self.points[::2]

    # -- a finished run ----------------------------------------------------------
    def load_metrics(self) -> int:
        """Fill the curves, the learner's last figures and the action log from ``metrics.jsonl``;
        the number of records read (0 when there is none yet)."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return 0
        read = 0
        with path.open() as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a crash
                if not isinstance(record, dict):
                    continue
                read += 1
                if is_learner_record(record):
                    self.learner_record = _clean(record)
                    self._add_point(self.learner_record, None)
                elif record.get("event") == "action":
                    self.actions.append(Action(**{k: record.get(k) for k in (
                        "id", "time", "origin", "action", "target", "status", "error", "ms")}))
                    self.actions[-1].results = [{"applied_ms": record.get("applied_ms")}]
                elif _number(record.get("success_rate")) is not None and self.points:
                    self.points[-1]["success_rate"] = record["success_rate"]
        return read

    # -- the page's view ---------------------------------------------------------
    def snapshot(self) -> dict:
        now = time.monotonic()
        learner = None
        if self.learner is not None or self.learner_record:
            status = self.learner.status if self.learner is not None else {}
            record = self.learner_record
            learner = {
                "connected": self.learner is not None and self.learner.connected,
                "last_seen_s": round(now - self.learner.last_seen, 2) if self.learner is not None else None,
                "env_steps": status.get("env_steps", record.get("env_steps")),
                "budget": status.get("budget"), "updates": status.get("updates", record.get("updates")),
                "updates_per_s": status.get("updates_per_s", record.get("updates_per_s")),
                "policy_version": status.get("policy_version", record.get("policy_version")),
                "policy_age": _number(status.get("policy_age", record.get("policy_age"))),
                "training": self._training(status),
                "replay": status.get("replay") or {"size": record.get("replay_size"),
                                                   "by_source": record.get("replay_by_source") or {}},
                "losses": status.get("losses") or {k: v for k, v in record.items()
                                                   if "loss" in k and _number(v) is not None},
                "nonfinite_updates_skipped": status.get("nonfinite_updates_skipped",
                                                        record.get("nonfinite_updates_skipped")),
                "peer": self.learner.who if self.learner is not None else None}
        actors = [self._actor_view(peer, now) for _, peer in sorted(self.actors.items())]
        live = any(p.connected for p in self.actors.values()) or (self.learner is not None and self.learner.connected)
        return {"t": "state", "time": time.time(), "run": str(self.run_dir),
                "finished": not live and bool(self.points),
                "learner": learner, "actors": actors, "admin_robots": self.admin_robots, **self._curves(),
                "actions": [a.entry() for a in self.actions]}

    def _training(self, status: dict) -> str:
        """running or paused while the learner is heard; once it is not, finished (its budget reached, or a
        finished run read from disk) or gone: never the last word of a learner that no longer speaks."""
        if self.learner is not None and self.learner.connected:
            return status.get("training", "running")
        budget, steps = status.get("budget"), status.get("env_steps")
        if self.learner is None or (_number(budget) and _number(steps) is not None and steps >= budget):
            return "finished"
        return "gone"

    def _actor_view(self, peer: Peer, now: float) -> dict:
        status = peer.status
        by_id = {d.get("device_id"): d for d in status.get("devices") or [] if isinstance(d, dict)}
        admin = {r["device_id"]: r["endpoint"] for r in self.admin_robots if r["actor_id"] == peer.actor_id}
        devices = []
        for declared in peer.devices:
            device_id = declared["device_id"]
            live = by_id.get(device_id, {})
            frames = {name: {"seq": f.seq, "width": f.width, "height": f.height, "age_s": round(now - f.received, 2)}
                      for (d, name), f in peer.frames.items() if d == device_id}
            devices.append({
                "device_id": device_id, "name": declared.get("name", ""),
                "estopped": bool(live.get("estopped", False)), "estop_reason": live.get("estop_reason") or "",
                "paused": bool(live.get("paused", False)), "takeover": bool(live.get("takeover", False)),
                "episode": live.get("episode") or {"step": None, "return": None},
                "safety": live.get("safety") or {}, "watchdog_trips": live.get("watchdog_trips", 0),
                "prompt": live.get("prompt"), "frames": frames, "admin_robot": admin.get(device_id)})
        return {"actor_id": peer.actor_id, "peer": peer.who, "status_error": peer.status_error,
                "connected": peer.connected,
                "last_seen_s": round(now - peer.last_seen, 2), "learner": status.get("learner", "unknown"),
                "env_steps": status.get("env_steps"), "episodes": status.get("episodes"),
                "teleop": any(d.get("teleop") for d in peer.devices), "reset": status.get("reset", "auto"),
                "link": status.get("link") or {}, "stream": status.get("stream") or {},
                "stream_error": status.get("stream_error", ""), "devices": devices}

    def _curves(self) -> dict:
        points = self.points
        if len(points) > MAX_POINTS:  # evenly thinned, the newest kept
            stride = -(-len(points) // MAX_POINTS)
            points = points[::-1][::stride][::-1]
        names = ("env_steps", "episode_return", "success_rate", "intervention_rate")
        losses = sorted({k for p in points for k in p if "loss" in k})
        return {"curves": {n: [p.get(n) for p in points] for n in names},
                "losses": {n: [p.get(n) for p in points] for n in ("env_steps", *losses)}}
