"""Any MJCF model as a :class:`~embodyrl.hal.device.Device`.

The observation is the joint state (``qpos``, ``qvel``) plus one field per
MJCF sensor (named by the sensor), or whatever an ``observation_fn`` builds,
plus one uint8 ``camera/<name>`` image (height x width x 3) per requested
camera, rendered offscreen. The action drives the actuators, clipped to
their control ranges. One control period is ``control_substeps`` physics
steps.

Domain randomisation (:class:`Randomization`) is drawn from the device's
RNG at every reset, always relative to the nominal model captured at
construction, so scales never compound across resets.

Headless rendering: MuJoCo picks its GL backend from ``MUJOCO_GL`` once, at
``import mujoco``. On Linux without a display, and only when the user has
not chosen, this module sets ``MUJOCO_GL=osmesa`` when libOSMesa is installed
(software GL; Debian's ``libosmesa6``, which ``.ci/setup`` installs), or
``egl`` when ``PYOPENGL_PLATFORM=egl``, before importing MuJoCo. Set
``MUJOCO_GL=egl`` yourself on a machine with a GPU.
"""

from __future__ import annotations

import os
import sys


def _prefer_headless_gl() -> None:
    if "mujoco" in sys.modules or "MUJOCO_GL" in os.environ:
        return  # too late to choose, or the user chose
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY") \
            and not os.environ.get("WAYLAND_DISPLAY"):
        import ctypes.util

        platform = os.environ.get("PYOPENGL_PLATFORM", "osmesa").lower()
        if platform == "egl":
            os.environ["MUJOCO_GL"] = "egl"
        elif ctypes.util.find_library("OSMesa"):  # absent: leave MuJoCo's default, fail only on render
            os.environ["MUJOCO_GL"] = "osmesa"


_prefer_headless_gl()

from collections import deque  # noqa: E402
from collections.abc import Callable, Mapping  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from ..device import Device  # noqa: E402
from ..specs import ArraySpec, DictSpec  # noqa: E402

ObservationFn = Callable[[mujoco.MjModel, mujoco.MjData], dict[str, np.ndarray]]
ResetFn = Callable[[mujoco.MjModel, mujoco.MjData, np.random.Generator], None]
CAMERA_PREFIX = "camera/"


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


@dataclass(frozen=True)
class Randomization:
    """Ranges drawn uniformly at every reset; ``(1, 1)`` and ``0`` mean nominal."""

    mass_scale: tuple[float, float] = (1.0, 1.0)
    """Each body's mass (and inertia) times a factor drawn in this range."""
    friction_scale: tuple[float, float] = (1.0, 1.0)
    """Each geom's friction coefficients times a factor drawn in this range."""
    actuator_gain_scale: tuple[float, float] = (1.0, 1.0)
    """Each actuator's gain (and position feedback) times a factor in this range."""
    observation_noise_std: float = 0.0
    """Std of Gaussian noise added to every float observation field (not images)."""
    action_latency_steps: tuple[int, int] = (0, 0)
    """Control steps (inclusive range) before a commanded action reaches the motors."""

    def __post_init__(self):
        for name in ("mass_scale", "friction_scale", "actuator_gain_scale", "action_latency_steps"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi or (name != "action_latency_steps" and lo <= 0):
                raise ValueError(f"Randomization.{name}: need 0 < low <= high, got ({lo}, {hi})")
        lo, hi = self.action_latency_steps
        if int(lo) != lo or int(hi) != hi:
            raise ValueError(f"Randomization.action_latency_steps: need integers, got ({lo}, {hi})")
        if not self.observation_noise_std >= 0:
            raise ValueError(f"Randomization.observation_noise_std: need >= 0, got {self.observation_noise_std}")


def _draw(rng: np.random.Generator, bounds: tuple[float, float], shape) -> np.ndarray:
    """Uniform factors; a degenerate range draws nothing, so the RNG stream is unchanged."""
    lo, hi = bounds
    return np.full(shape, float(lo)) if lo == hi else rng.uniform(lo, hi, size=shape)


class _Nominal:
    """The model's parameters as built, the base every randomisation scales."""

    def __init__(self, model: mujoco.MjModel):
        self.body_mass = model.body_mass.copy()
        self.body_inertia = model.body_inertia.copy()
        self.geom_friction = model.geom_friction.copy()
        self.gain = model.actuator_gainprm[:, 0].copy()
        self.position_bias = model.actuator_biasprm[:, 1].copy()

    def apply(self, model: mujoco.MjModel, r: Randomization, rng: np.random.Generator) -> None:
        mass = _draw(rng, r.mass_scale, (model.nbody,))
        model.body_mass[:] = self.body_mass * mass
        model.body_inertia[:] = self.body_inertia * mass[:, None]
        model.geom_friction[:] = self.geom_friction * _draw(rng, r.friction_scale, (model.ngeom, 1))
        gain = _draw(rng, r.actuator_gain_scale, (model.nu,))
        model.actuator_gainprm[:, 0] = self.gain * gain
        model.actuator_biasprm[:, 1] = self.position_bias * gain


class Cameras:
    """Offscreen renderers for named MJCF cameras, one per distinct resolution."""

    def __init__(self, model: mujoco.MjModel, sizes: Mapping[str, tuple[int, int]], effects: bool = False):
        self.model = model
        self.effects = effects
        self.sizes = {}
        for name, size in sizes.items():
            if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, name) < 0:
                known = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
                raise ValueError(f"camera {name!r} is not in the model; its cameras: {known}")
            width, height = (int(v) for v in size)
            if width < 1 or height < 1:
                raise ValueError(f"camera {name!r}: size must be (width, height) >= 1, got {size}")
            self.sizes[name] = (width, height)
        # the offscreen framebuffer must hold the largest image
        model.vis.global_.offwidth = max([model.vis.global_.offwidth, *(w for w, _ in self.sizes.values())])
        model.vis.global_.offheight = max([model.vis.global_.offheight, *(h for _, h in self.sizes.values())])
        self._renderers: dict[tuple[int, int], mujoco.Renderer] = {}

    def specs(self) -> tuple[ArraySpec, ...]:
        return tuple(ArraySpec(CAMERA_PREFIX + n, (h, w, 3), np.uint8, 0, 255)
                     for n, (w, h) in self.sizes.items())

    def open(self) -> None:
        for size in set(self.sizes.values()):
            if size not in self._renderers:
                try:
                    renderer = mujoco.Renderer(self.model, height=size[1], width=size[0])
                except Exception as err:
                    raise RuntimeError(
                        f"offscreen rendering failed with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}: {err}. "
                        "Headless Linux needs libosmesa6 and MUJOCO_GL=osmesa (or egl) set before "
                        "mujoco is first imported") from err
                if not self.effects:  # software GL renders ~15x faster without them
                    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                                 mujoco.mjtRndFlag.mjRND_SKYBOX):
                        renderer.scene.flags[flag] = False
                self._renderers[size] = renderer

    def close(self) -> None:
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers.clear()

    def render(self, data: mujoco.MjData) -> dict[str, np.ndarray]:
        images = {}
        for name, size in self.sizes.items():
            renderer = self._renderers[size]
            renderer.update_scene(data, camera=name)
            images[CAMERA_PREFIX + name] = renderer.render()
        return images


class MujocoDevice(Device):
    """A MuJoCo simulation behind the same interface as a real robot."""

    def __init__(self, model: str | Path | mujoco.MjModel, *, control_substeps: int = 10,
                 observation_fn: ObservationFn | None = None,
                 observation_spec: DictSpec | None = None,
                 reset_fn: ResetFn | None = None,
                 randomization: Randomization | None = None,
                 cameras: Mapping[str, tuple[int, int]] | None = None, camera_effects: bool = False):
        """``cameras`` maps an MJCF camera name to its image size ``(width, height)``;
        ``camera_effects`` turns on shadows, reflections and the skybox (slow in software GL)."""
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
        self.cameras = Cameras(self.model, cameras or {}, camera_effects)
        self.observation_spec = DictSpec((*observation_spec.specs, *self.cameras.specs()))
        self._observe = observation_fn
        self._noisy = [s.name for s in observation_spec.specs if s.dtype.kind == "f"]
        self._reset_fn = reset_fn
        self.randomization = randomization or Randomization()
        self._nominal = _Nominal(self.model)
        self._pending: deque[np.ndarray] = deque()
        self.action_latency_steps = 0
        self._rng = np.random.default_rng()
        self._low = np.where(np.isfinite(self.action_spec.minimum), self.action_spec.minimum, -np.inf)
        self._high = np.where(np.isfinite(self.action_spec.maximum), self.action_spec.maximum, np.inf)

    def _connect(self) -> None:
        self.cameras.open()

    def _close(self) -> None:
        self.cameras.close()

    def _reset(self, seed: int | None) -> dict[str, np.ndarray]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if self.model.nkey > 0:
            mujoco.mj_resetDataKeyframe(self.model, self.data, 0)
        else:
            mujoco.mj_resetData(self.model, self.data)
        r = self.randomization
        self._nominal.apply(self.model, r, self._rng)
        lo, hi = r.action_latency_steps
        self.action_latency_steps = int(lo if lo == hi else self._rng.integers(lo, hi + 1))
        self._pending = deque([np.zeros(self.model.nu)] * self.action_latency_steps)
        if self._reset_fn is not None:
            self._reset_fn(self.model, self.data, self._rng)
        mujoco.mj_forward(self.model, self.data)
        return self._observation()

    def _step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        clipped = np.minimum(np.maximum(action, self._low), self._high)  # np.clip costs ~2 us more
        if not self._pending:  # no action latency: straight to the actuators
            self.data.ctrl[:] = clipped
        else:
            self._pending.append(clipped)
            self.data.ctrl[:] = self._pending.popleft()
        mujoco.mj_step(self.model, self.data, nstep=self.control_substeps)
        return self._observation()

    def _observation(self) -> dict[str, np.ndarray]:
        obs = self._observe(self.model, self.data)
        std = self.randomization.observation_noise_std
        if std > 0:
            for name in self._noisy:
                value = obs[name]
                obs[name] = (value + self._rng.normal(0.0, std, value.shape)).astype(value.dtype)
        if self.cameras.sizes:
            obs.update(self.cameras.render(self.data))
        return obs

    def _on_estop(self) -> None:
        self.data.ctrl[:] = 0.0
        self._pending = deque([np.zeros(self.model.nu)] * len(self._pending))
