"""The device kinds one policy serves, and the row layout the learner stores their steps in.

Every run has a layout. A plain task is a layout with one device kind: its
rows are stored as the device sends them, and any number of devices of that
kind (any device ids) may feed it. A task ``a+b`` is the same with more
kinds, indexed by the device id their actors send (``kinds[i]`` is device
``i``); the learner pads each device's rows into one shared layout before
the replay stores them:

* ``observation/features``: the device's observation, flattened in its spec's
  field order, zero-padded to the widest device's size (float32);
* ``observation/device``: the device id (int32), the route;
* ``action``: the device's action mapped to [-1, 1] by its own bounds,
  zero-padded to the widest action.

The policy's per-device heads read the route (:mod:`embodyrl.algos.heads`);
an actor pads its device's observation in and takes its device's slice of
the action out (:meth:`Layout.unpad_action`). Several kinds train from state
observations with finite action bounds (a device kind that observes an image
is refused by name). numpy only: the edge pads too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .specs import ArraySpec, DictSpec
from .steps import Steps

FEATURES, DEVICE = "features", "device"


@dataclass(frozen=True)
class DeviceKind:
    name: str
    observation_spec: DictSpec
    action_spec: ArraySpec


@dataclass(frozen=True)
class Layout:
    kinds: tuple[DeviceKind, ...]
    observation_spec: DictSpec = field(init=False)
    """What the learner stores and its networks read (a one-kind layout: the device's own)."""
    action_spec: ArraySpec = field(init=False)

    @classmethod
    def of(cls, name: str, observation_spec: DictSpec, action_spec: ArraySpec) -> Layout:
        """The layout of one device kind."""
        return cls((DeviceKind(name, observation_spec, action_spec),))

    def __post_init__(self):
        if not self.kinds:
            raise ValueError("a layout needs at least one device kind")
        if not self.padded:
            kind = self.kinds[0]
            object.__setattr__(self, "observation_spec", kind.observation_spec)
            object.__setattr__(self, "action_spec", kind.action_spec)
            return
        names = [kind.name for kind in self.kinds]
        if len(set(names)) != len(names):
            raise ValueError(f"device kinds must differ in name, got {names}")
        for kind in self.kinds:
            _scale(kind.action_spec)  # finite bounds, or a clear error naming the action
            for spec in kind.observation_spec.specs:
                if spec.dtype == np.uint8 or len(spec.shape) >= 3:
                    raise ValueError(f"several device kinds: {kind.name!r} observes an image ({spec.name!r}, "
                                     f"{spec.dtype}{list(spec.shape)}); state observations only")
        width = max(self.observation_sizes)
        object.__setattr__(self, "observation_spec", DictSpec.of(
            ArraySpec(FEATURES, (width,), np.float32), ArraySpec(DEVICE, (), np.int32, 0, len(self.kinds) - 1)))
        object.__setattr__(self, "action_spec", ArraySpec("action", (max(self.action_sizes),), np.float32, -1, 1))

    # -- what the layout is ----------------------------------------------------
    @property
    def padded(self) -> bool:
        """Whether rows are padded into a shared layout (several kinds) or stored as sent (one)."""
        return len(self.kinds) > 1

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(kind.name for kind in self.kinds)

    @property
    def observation_sizes(self) -> tuple[int, ...]:
        return tuple(sum(s.size for s in k.observation_spec.specs) for k in self.kinds)

    @property
    def action_sizes(self) -> tuple[int, ...]:
        return tuple(k.action_spec.size for k in self.kinds)

    def kind_of(self, device_id: int) -> int:
        """Which kind a device id is: its own index with several kinds; the one kind otherwise."""
        return device_id if self.padded else 0

    def index(self, name: str | None) -> int:
        """The device id of kind ``name`` (None: the only kind); ValueError naming the kinds."""
        if name is None and not self.padded:
            return 0
        if name not in self.names:
            if not self.padded:
                raise ValueError(f"the run has one device kind, {self.names[0]!r}; {name!r} is not it")
            raise ValueError(f"the run has several device kinds: name one of {', '.join(self.names)}")
        return self.names.index(name)

    def refusal(self, device_id: int, name: str, observation_spec: DictSpec, action_spec: ArraySpec) -> str | None:
        """Why a declared device does not fit this layout (None when it does)."""
        if self.padded and not 0 <= device_id < len(self.kinds):
            return f"device {name!r}: id {device_id} is not one of the {len(self.kinds)} declared device kinds"
        kind = self.kinds[self.kind_of(device_id)]
        if observation_spec != kind.observation_spec or action_spec != kind.action_spec:
            if not self.padded:
                return f"device {name!r} has specs that differ from this learner's task"
            return f"device {name!r} (id {device_id}) has specs that differ from declared kind {kind.name!r}"
        return None

    def collect(self, per_kind: dict[str, dict]) -> dict:
        """Figures by kind as a run reports them: under ``devices``, and with one kind at the top
        level too (where a one-device run's readers look)."""
        return {**(per_kind[self.kinds[0].name] if not self.padded else {}), "devices": per_kind}

    # -- rows in and actions out -----------------------------------------------
    def pad_observation(self, device_id: int, observation) -> dict[str, np.ndarray]:
        """One device's observation (optionally batched) in the stored layout."""
        if not self.padded:
            return observation
        spec = self.kinds[device_id].observation_spec
        parts = [np.asarray(observation[s.name], np.float32) for s in spec.specs]
        lead = parts[0].shape[: parts[0].ndim - len(spec.specs[0].shape)]
        flat = np.concatenate([p.reshape(*lead, -1) for p in parts], axis=-1)
        padded = np.zeros((*lead, self.observation_spec[FEATURES].shape[0]), np.float32)
        padded[..., : flat.shape[-1]] = flat
        return {FEATURES: padded, DEVICE: np.full(lead, device_id, np.int32)}

    def pad_action(self, device_id: int, action) -> np.ndarray:
        """A device's action (env units) as the stored action."""
        if not self.padded:
            return action
        center, half_range = _scale(self.kinds[device_id].action_spec)
        unit = (np.asarray(action, np.float32) - center) / half_range
        out = np.zeros((*unit.shape[:-1], self.action_spec.shape[0]), np.float32)
        out[..., : unit.shape[-1]] = np.clip(unit, -1.0, 1.0)
        return out

    def pad_steps(self, device_id: int, steps: Steps) -> Steps:
        """A batch of one device's rows in the stored layout (everything else unchanged)."""
        if not self.padded:
            return steps
        return replace(steps, observation=self.pad_observation(device_id, steps.observation),
                       action=self.pad_action(device_id, steps.action),
                       proposed_action=self.pad_action(device_id, steps.proposed_action))

    def unpad_action(self, device_id: int, action: np.ndarray) -> np.ndarray:
        """The policy's action for one device, in the device's own units, shape and dtype."""
        spec = self.kinds[self.kind_of(device_id)].action_spec
        if not self.padded:
            return np.asarray(action, spec.dtype)
        center, half_range = _scale(spec)
        unit = np.asarray(action)[: spec.size].reshape(spec.shape)
        return spec.clip((unit * half_range + center).astype(spec.dtype))


def _scale(spec: ArraySpec) -> tuple[np.ndarray, np.ndarray]:
    """(center, half range) of finite action bounds, or a clear error naming the action."""
    if not spec.bounded or not np.isfinite(spec.minimum).all() or not np.isfinite(spec.maximum).all():
        raise ValueError(f"{spec.name}: continuous control needs finite action bounds")
    return ((spec.maximum + spec.minimum) / 2).astype(np.float32), ((spec.maximum - spec.minimum) / 2).astype(np.float32)
