"""Device groups: several devices of different shapes driven by one actor.

``DeviceGroup({"arm": arm, "gripper": gripper})`` gives each member a
distinct device id (its position, or the ids you pass) and keeps each
member's own specs: the actor loop drives each member with its own policy
and its own :class:`~embodyrl.hal.steps.StepRecorder`, so the step stream
is tagged by device id and each device's rows go in their own STEPS
messages.

The group is also a :class:`Device` in its own right (it passes the
conformance suite), for code that wants one action and one observation: the
observation is every member's fields under ``"<member>/<field>"`` and the
action is the members' actions concatenated (in member order) into one
vector. An e-stop of the group stops every member; the group's health is
its worst member's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .device import Device, Health
from .specs import ArraySpec, DictSpec

_SEVERITY = {"ok": 0, "degraded": 1, "faulted": 2}


@dataclass(frozen=True)
class Member:
    """One device of a group."""

    name: str
    device_id: int
    device: Device


class DeviceGroup(Device):
    """Named devices with distinct ids, stepped together or one by one."""

    def __init__(self, devices: Mapping[str, Device], device_ids: Mapping[str, int] | None = None):
        super().__init__()
        if not devices:
            raise ValueError("DeviceGroup needs at least one device")
        ids = dict(device_ids) if device_ids is not None else {n: i for i, n in enumerate(devices)}
        if set(ids) != set(devices):
            raise ValueError(f"device_ids: names {sorted(ids)} differ from devices {sorted(devices)}")
        if len(set(ids.values())) != len(ids):
            raise ValueError(f"device_ids: ids must be distinct, got {ids}")
        for name in devices:
            if "/" in name:
                raise ValueError(f"device name {name!r}: '/' separates member and field names")
        self.members: tuple[Member, ...] = tuple(Member(n, int(ids[n]), d) for n, d in devices.items())
        self.control_period_s = max(m.device.control_period_s for m in self.members)
        self.observation_spec = DictSpec(tuple(
            ArraySpec(f"{m.name}/{s.name}", s.shape, s.dtype, s.minimum, s.maximum)
            for m in self.members for s in m.device.observation_spec.specs))
        self.action_spec = self._joint_action_spec()

    def _joint_action_spec(self) -> ArraySpec:
        specs = [m.device.action_spec for m in self.members]
        dtype = np.result_type(*[s.dtype for s in specs])
        self._slices, start = [], 0
        lows, highs = [], []
        for s in specs:
            self._slices.append(slice(start, start + s.size))
            start += s.size
            lows.append(np.full(s.size, -np.inf) if s.minimum is None else s.minimum.reshape(-1))
            highs.append(np.full(s.size, np.inf) if s.maximum is None else s.maximum.reshape(-1))
        return ArraySpec("action", (start,), dtype, np.concatenate(lows), np.concatenate(highs))

    def __getitem__(self, name: str) -> Device:
        for m in self.members:
            if m.name == name:
                return m.device
        raise KeyError(f"no device {name!r} in the group; members: {[m.name for m in self.members]}")

    # -- lifecycle -------------------------------------------------------
    def _connect(self) -> None:
        connected = []
        try:
            for m in self.members:
                m.device.connect()
                connected.append(m.device)
        except BaseException:
            for device in reversed(connected):
                device.close()
            raise

    def _close(self) -> None:
        for m in reversed(self.members):
            m.device.close()

    # -- the group as one device -----------------------------------------
    def _reset(self, seed):
        return self._join({m.name: m.device.reset(None if seed is None else seed + m.device_id)
                           for m in self.members})

    def _step(self, action: np.ndarray):
        parts = self.split_action(action)
        return self._join({m.name: m.device.step(parts[m.name]) for m in self.members})

    def split_action(self, action: np.ndarray) -> dict[str, np.ndarray]:
        """The joint action as one action per member, in each member's own shape and dtype."""
        return {m.name: action[sl].reshape(m.device.action_spec.shape).astype(m.device.action_spec.dtype)
                for m, sl in zip(self.members, self._slices, strict=True)}

    def _join(self, observations: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {f"{name}/{field}": value for name, obs in observations.items()
                for field, value in obs.items()}

    # -- health and e-stop -----------------------------------------------
    def _health(self) -> Health:
        worst = Health()
        for m in self.members:
            h = m.device.health()
            if _SEVERITY[h.status] > _SEVERITY[worst.status]:
                worst = Health(h.status, f"{m.name}: {h.reason}")
        return worst

    def _on_estop(self) -> None:
        for m in self.members:
            m.device.estop(f"group e-stop: {self._estop_reason}")

    def clear_estop(self) -> None:
        for m in self.members:
            m.device.clear_estop()
        super().clear_estop()
