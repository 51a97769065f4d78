"""Any MJCF model as a :class:`~embodyrl.hal.device.Device`.

The observation is the joint state (``qpos``, ``qvel``) plus one field per
MJCF sensor (named by the sensor), or whatever an ``observation_fn`` builds. The action drives the actuators, clipped to their
control ranges. One control period is ``control_substeps`` physics steps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np

from ..device import Device
from ..specs import ArraySpec, DictSpec

ObservationFn = Callable[[mujoco.MjModel, mujoco.MjData], dict[str, np.ndarray]]
ResetFn = Callable[[mujoco.MjModel, mujoco.MjData, np.random.Generator], None]


def load_model(model: str | Path | mujoco.MjModel) -> mujoco.MjModel:
    if isinstance(model, mujoco.MjModel):
        return model
    path = Path(model)
    if path.suffix == ".xml" and path.exists():
        return mujoco.MjModel.from_xml_path(str(path))
    return mujoco.MjModel.from_xml_string(str(model))


def actuator_spec(model: mujoco.MjModel) -> ArraySpec:
    """Action spec: one float32 per actuator, bounded by its control range."""
    lo = np.full(model.nu, -np.inf)
    hi = np.full(model.nu, np.inf)
    limited = model.actuator_ctrllimited.astype(bool)
    lo[limited] = model.actuator_ctrlrange[limited, 0]
    hi[limited] = model.actuator_ctrlrange[limited, 1]
    return ArraySpec("action", (model.nu,), np.float32, lo, hi)


def sensor_observation(model: mujoco.MjModel) -> tuple[DictSpec, ObservationFn]:
    """Joint state (``qpos``, ``qvel``) plus one float32 field per MJCF sensor."""
    slices = {"qpos": None, "qvel": None}
    for i in range(model.nsensor):
        name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_SENSOR, i) or f"sensor_{i}"
        if name in slices:
            raise ValueError(f"sensor name {name!r} clashes with another observation field")
        start = int(model.sensor_adr[i])
        slices[name] = slice(start, start + int(model.sensor_dim[i]))
    sizes = {"qpos": model.nq, "qvel": model.nv}
    spec = DictSpec(tuple(ArraySpec(n, (sizes[n] if s is None else s.stop - s.start,), np.float32)
                          for n, s in slices.items()))
    sensors = {n: s for n, s in slices.items() if s is not None}

    def observe(m, d):
        obs = {"qpos": d.qpos.astype(np.float32), "qvel": d.qvel.astype(np.float32)}
        for n, s in sensors.items():
            obs[n] = d.sensordata[s].astype(np.float32)
        return obs

    return spec, observe


class MujocoDevice(Device):
    """A MuJoCo simulation behind the same interface as a real robot."""

    def __init__(self, model: str | Path | mujoco.MjModel, *, control_substeps: int = 10,
                 observation_fn: ObservationFn | None = None,
                 observation_spec: DictSpec | None = None,
                 reset_fn: ResetFn | None = None):
        super().__init__()
        if (observation_fn is None) != (observation_spec is None):
            raise ValueError("give observation_fn and observation_spec together")
        if control_substeps < 1:
            raise ValueError(f"control_substeps must be >= 1, got {control_substeps}")
        self.model = load_model(model)
        self.data = mujoco.MjData(self.model)
        self.control_substeps = control_substeps
        self.control_period_s = control_substeps * float(self.model.opt.timestep)
        self.action_spec = actuator_spec(self.model)
        if observation_fn is None:
            observation_spec, observation_fn = sensor_observation(self.model)
        self.observation_spec = observation_spec
        self._observe = observation_fn
        self._reset_fn = reset_fn
        self._rng = np.random.default_rng()
        self._low = np.where(np.isfinite(self.action_spec.minimum), self.action_spec.minimum, -np.inf)
        self._high = np.where(np.isfinite(self.action_spec.maximum), self.action_spec.maximum, np.inf)

    def _reset(self, seed: int | None) -> dict[str, np.ndarray]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if self.model.nkey > 0:
            mujoco.mj_resetDataKeyframe(self.model, self.data, 0)
        else:
            mujoco.mj_resetData(self.model, self.data)
        if self._reset_fn is not None:
            self._reset_fn(self.model, self.data, self._rng)
        mujoco.mj_forward(self.model, self.data)
        return self._observe(self.model, self.data)

    def _step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        self.data.ctrl[:] = np.clip(action, self._low, self._high)
        mujoco.mj_step(self.model, self.data, nstep=self.control_substeps)
        return self._observe(self.model, self.data)

    def _on_estop(self) -> None:
        self.data.ctrl[:] = 0.0
