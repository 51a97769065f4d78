"""A global grid of atmospheric columns: the testbed for learnt model corrections.

State: potential temperature ``theta`` [columns, levels] (columns are lat-major
over a ``nlat`` x ``nlon`` grid; level 0 is the lowest, 70 levels equally
spaced in pressure from 995 to 15 hPa). Each step of ``dt_s`` applies, in
order (process splitting):

* relaxation toward a radiative-equilibrium profile (Held and Suarez 1994
  shape) whose latitude of maximum heating follows the season and whose
  lowest layers feel the diurnal cycle of local solar time;
* stochastic weather: an AR(1) heating field, spatially smoothed, plus
  travelling planetary waves, so forecasts from different start dates
  differ and no constant correction is optimal;
* vertical diffusion and horizontal exchange with neighbouring columns
  (periodic in longitude, no flux across the poles);
* dry convective adjustment: unstable neighbouring layers mix to a common
  theta, conserving the column's heat content sum(c_p T dp / g).

Two testbeds (:data:`TESTBEDS`), each a (truth, model) pair of configurations:

* ``mistuned``: ``ColumnConfig.truth()`` produces the analysis;
  ``ColumnConfig.model()`` has systematic errors: a stronger equator-pole
  heating contrast, a shorter relaxation time, and convection that tolerates
  a slightly unstable profile. Its error is nearly affine in the state.
* ``moist``: the truth gains moist convection that the model lacks entirely
  (:meth:`ColumnModel.convective_heating`, in the spirit of Betts and
  Miller: where a column's surface air is moist enough and a parcel lifted
  from it is buoyant, the column relaxes toward the parcel's temperature
  above the condensation level and its sub-cloud layer is cooled); the
  weather noise is weaker, and nothing else differs. Each column's context
  then also carries its surface air's potential temperature, as a learnt
  parametrisation's inputs would.

Diagnostics per latitude band: the height of the 500 hPa surface
from hydrostatic integration (a Z500 analogue) and T at 850 hPa.

Decomposition: a :class:`ColumnModel` steps a block of latitude rows
(``rows``); the horizontal exchange then needs one halo row from each
neighbouring block, which :meth:`ColumnModel.step` asks of a callback (an
MPI rank asks its neighbours). Every block draws the same full-grid weather
noise from the shared seed, so a decomposed run equals the serial one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

KAPPA = 0.2857
R_DRY = 287.0
GRAVITY = 9.81
DAY_S = 86400.0
BANDS = 6
LATENT_OVER_CP = 2.5e6 / 1004.0
"""L / c_p (K per kg/kg of water vapour condensed)."""


@dataclass(frozen=True)
class ColumnConfig:
    nlat: int = 32
    nlon: int = 64
    levels: int = 70
    dt_s: float = 1800.0
    delta_t_y: float = 60.0
    """Equator-pole contrast of the equilibrium temperature (K)."""
    delta_theta_z: float = 10.0
    tau_surface_days: float = 4.0
    tau_free_days: float = 40.0
    diurnal_amplitude: float = 3.0
    """Amplitude (K) of the diurnal cycle of the equilibrium in the lowest layers."""
    vertical_diffusion: float = 0.02
    """Per-step mixing fraction between neighbouring levels."""
    horizontal_exchange: float = 0.05
    """Per-step mixing fraction between neighbouring columns."""
    convective_tolerance: float = 0.0
    """Theta may decrease upward by this much (K) before convection mixes."""
    weather_std: float = 0.6
    """Std (K/day) of the AR(1) heating."""
    weather_memory_days: float = 2.0
    wave_amplitude: float = 2.0
    """Amplitude (K/day) of the travelling waves' heating."""
    moist_convection: bool = False
    """Moist convection (:meth:`ColumnModel.convective_heating`): the ``moist`` testbed's truth."""
    convective_tau_hours: float = 2.0
    """Relaxation time toward the lifted parcel's temperature where a column convects."""
    moisture_threshold: float = 0.010
    """Surface specific humidity (kg/kg) a column needs to convect: moist enough."""
    subcloud_cooling: float = 6.0
    """Cooling (K/day) of a convecting column's levels below the condensation level (downdrafts)."""
    cloud_top_hpa: float = 150.0
    """No convective heating above this pressure."""
    surface_context: bool = False
    """The context carries the surface air's potential temperature (the ``moist`` testbed's inputs)."""

    @classmethod
    def truth(cls, **kw) -> ColumnConfig:
        return cls(**kw)

    @classmethod
    def model(cls, **kw) -> ColumnConfig:
        return replace(cls(**kw), delta_t_y=70.0, tau_surface_days=3.0, tau_free_days=30.0,
                       convective_tolerance=0.5)

    @classmethod
    def moist_truth(cls, **kw) -> ColumnConfig:
        """The ``moist`` testbed's truth: moist convection, weak weather noise (0.2 K/day), so that
        the model's error is the missing process more than the weather it cannot know."""
        return cls(**{"weather_std": 0.2, "moist_convection": True, "surface_context": True, **kw})

    @classmethod
    def moist_model(cls, **kw) -> ColumnConfig:
        """The ``moist`` testbed's model: the truth without moist convection, and nothing else."""
        return replace(cls.moist_truth(**kw), moist_convection=False)

    @property
    def columns(self) -> int:
        return self.nlat * self.nlon

    @property
    def context_size(self) -> int:
        """Per-column context of :meth:`ColumnModel.context`."""
        return ColumnModel.CONTEXT + int(self.surface_context)


TESTBEDS = {"mistuned": (ColumnConfig.truth, ColumnConfig.model),
            "moist": (ColumnConfig.moist_truth, ColumnConfig.moist_model)}
"""Testbed name -> (truth, model) configuration constructors (keyword arguments: the grid)."""


def saturation_humidity(T: np.ndarray, p_hpa) -> np.ndarray:
    """Saturation specific humidity (kg/kg) at temperature ``T`` (K) and pressure ``p_hpa``
    (Bolton 1980's vapour pressure over water)."""
    vapour = 6.112 * np.exp(17.67 * (T - 273.15) / (T - 29.65))
    return 0.622 * vapour / np.maximum(p_hpa - 0.378 * vapour, 1e-3)


def lifted_parcel(theta_surface: np.ndarray, humidity: np.ndarray, p_hpa: np.ndarray,
                  exner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(temperature [n, levels], whether saturated [n, levels]) of surface air lifted through the
    column: dry-adiabatic below its condensation level, then on the pseudo-adiabat of its equivalent
    potential temperature theta_e = theta exp(L q / (c_p T)), solved by Newton's method."""
    t_surface = theta_surface * exner[0]
    ln_theta_e = (np.log(theta_surface) + LATENT_OVER_CP * humidity / t_surface)[:, None]
    dry = theta_surface[:, None] * exner[None, :]
    T, ln_exner = dry.copy(), np.log(exner)[None, :]
    for _ in range(6):
        q = saturation_humidity(T, p_hpa[None, :])
        residual = np.log(T) - ln_exner + LATENT_OVER_CP * q / T - ln_theta_e
        dq = q * 4302.6 / (T - 29.65) ** 2  # dq_sat/dT (Bolton's exponent's derivative)
        T = np.clip(T - residual / (1.0 / T + LATENT_OVER_CP * (dq * T - q) / T ** 2), 60.0, 400.0)
    saturated = dry < T
    return np.where(saturated, T, dry), saturated


def row_split(nlat: int, parts: int) -> list[range]:
    """Latitude rows per block, of nearly equal area: polar blocks get more rows than
    tropical ones, so the blocks' column counts differ (as in a real decomposition)."""
    if not 1 <= parts <= nlat:
        raise ValueError(f"cannot split {nlat} latitude rows into {parts} blocks")
    lat = np.deg2rad(np.linspace(-90 + 90 / nlat, 90 - 90 / nlat, nlat))
    cum = np.cumsum(np.cos(lat))
    edges = [0, *[int(np.searchsorted(cum, cum[-1] * i / parts)) + 1 for i in range(1, parts)], nlat]
    for i in range(1, parts + 1):  # every block keeps at least one row
        edges[i] = min(max(edges[i], edges[i - 1] + 1), nlat - (parts - i))
    return [range(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


class ColumnGrid:
    """Geometry and vertical coordinates shared by truth and model."""

    def __init__(self, cfg: ColumnConfig):
        self.cfg = cfg
        self.lat = np.deg2rad(np.linspace(-90 + 90 / cfg.nlat, 90 - 90 / cfg.nlat, cfg.nlat))
        self.lon = np.linspace(0, 2 * np.pi, cfg.nlon, endpoint=False)
        lat2, lon2 = np.meshgrid(self.lat, self.lon, indexing="ij")
        self.col_lat, self.col_lon = lat2.reshape(-1), lon2.reshape(-1)
        self.p = np.linspace(995.0, 15.0, cfg.levels)  # hPa, level 0 lowest
        self.dp = np.full(cfg.levels, self.p[0] - self.p[1])
        self.exner = (self.p / 1000.0) ** KAPPA
        self.band = np.minimum(((np.rad2deg(self.col_lat) + 90) // (180 / BANDS)).astype(int), BANDS - 1)
        self.area = np.cos(self.col_lat)

    def temperature(self, theta):
        return theta * self.exner

    def heat_content(self, theta):
        """Column heat content per unit area, c_p sum(T dp) / g (J/m^2), per column."""
        return 1004.0 * np.sum(self.temperature(theta) * self.dp * 100.0, axis=-1) / GRAVITY

    def z500(self, theta):
        """Height (m) of the 500 hPa surface above the 1000 hPa surface, hydrostatically."""
        T = self.temperature(theta)
        edges = np.concatenate([[1000.0], 0.5 * (self.p[1:] + self.p[:-1]), [self.p[-1] - 7.0]])
        below = np.clip(np.log(edges[:-1] / np.maximum(edges[1:], 500.0)), 0, None)
        return np.sum(R_DRY * T / GRAVITY * below, axis=-1)

    def t850(self, theta):
        """Temperature (K) at 850 hPa, linear in pressure between the levels around it."""
        k = int(np.searchsorted(-self.p, -850.0)) - 1
        w = (self.p[k] - 850.0) / (self.p[k] - self.p[k + 1])
        T = self.temperature(theta)
        return (1 - w) * T[..., k] + w * T[..., k + 1]

    def band_means(self, field):
        """Area-weighted mean of a per-column field in each of the 6 latitude bands."""
        w = self.area
        return np.array([np.sum(field[self.band == b] * w[self.band == b]) / np.sum(w[self.band == b])
                         for b in range(BANDS)])


class ColumnModel:
    """Steps a block of latitude rows (all of them by default) of the grid."""

    FEATURES = 3
    """Per-level features of :meth:`features`: theta, pressure, relaxation tendency (scaled)."""
    CONTEXT = 6
    """Per-column context of :meth:`context`: latitude, local hour, season (sin and cos)."""

    def __init__(self, cfg: ColumnConfig, seed: int = 0, rows: range | None = None):
        self.cfg = cfg
        self.grid = ColumnGrid(cfg)
        self.rows = range(cfg.nlat) if rows is None else rows
        if not (0 <= self.rows.start < self.rows.stop <= cfg.nlat and self.rows.step == 1):
            raise ValueError(f"rows {self.rows} is not a block of the {cfg.nlat} latitude rows")
        self.columns = np.arange(self.rows.start * cfg.nlon, self.rows.stop * cfg.nlon)
        g = self.grid
        self.col_lat, self.col_lon = g.col_lat[self.columns], g.col_lon[self.columns]
        self.band, self.area = g.band[self.columns], g.area[self.columns]
        self.rng = np.random.default_rng(seed)
        self.weather = np.zeros((len(self.columns), cfg.levels))
        self.time_s = 0.0
        lat = self.col_lat[:, None]
        self._tau = DAY_S * (cfg.tau_free_days + (cfg.tau_surface_days - cfg.tau_free_days)
                             * np.clip((g.p - 700.0) / 295.0, 0, 1)[None, :] * np.cos(lat) ** 4)
        self._level_shape = np.exp(-((g.p - 500.0) / 250.0) ** 2)[None, :]

    # -- physics ---------------------------------------------------------
    def equilibrium(self, time_s: float) -> np.ndarray:
        cfg, g = self.cfg, self.grid
        season = np.deg2rad(23.5) * np.sin(2 * np.pi * time_s / (365.0 * DAY_S))
        lat = self.col_lat[:, None] - season
        log_p = np.log(g.p / 1000.0)[None, :]
        T = (315.0 - cfg.delta_t_y * np.sin(lat) ** 2 - cfg.delta_theta_z * log_p * np.cos(lat) ** 2) * g.exner
        local_hour = self.local_hour(time_s)[:, None]
        surface = np.clip((g.p - 800.0) / 195.0, 0, 1)[None, :]
        T = T + cfg.diurnal_amplitude * surface * np.cos(local_hour - np.pi) * np.cos(self.col_lat[:, None])
        return np.maximum(T, 200.0) / g.exner

    def tendency(self, theta: np.ndarray, time_s: float) -> np.ndarray:
        """Relaxation plus weather heating (K/s) for every column of the block (and moist convection,
        where the configuration has it)."""
        cfg = self.cfg
        relax = (self.equilibrium(time_s) - theta) / self._tau
        waves = cfg.wave_amplitude / DAY_S * np.cos(3 * self.col_lon[:, None] - 2 * np.pi * time_s / (6 * DAY_S)) \
            * np.sin(2 * self.col_lat[:, None]) ** 2 * self._level_shape
        tend = relax + self.weather / DAY_S + waves
        if cfg.moist_convection:
            tend = tend + self.convective_heating(theta, time_s)
        return tend

    def local_hour(self, time_s: float) -> np.ndarray:
        """Each column's local solar time as an angle (radians; noon at pi)."""
        return 2 * np.pi * time_s / DAY_S + self.col_lon

    def surface_humidity(self, theta: np.ndarray, time_s: float) -> np.ndarray:
        """Specific humidity (kg/kg) of each column's surface air: a relative humidity that is higher in
        the tropics and lower in the afternoon (0.45 to 0.95), times saturation at the surface."""
        hour = self.local_hour(time_s)
        relative = 0.7 + 0.15 * np.cos(2 * self.col_lat) - 0.1 * np.cos(hour - np.pi)
        return relative * saturation_humidity(theta[:, 0] * self.grid.exner[0], self.grid.p[0])

    def convective_heating(self, theta: np.ndarray, time_s: float) -> np.ndarray:
        """Moist convection's tendency (K/s of theta) [columns, levels], zero where a column does not
        convect. A column convects where its surface air is moist enough (``moisture_threshold``) and
        a parcel lifted from it is warmer than its environment at some level below ``cloud_top_hpa``.
        There, above the parcel's condensation level, the levels where the parcel is warmer relax
        toward its temperature over ``convective_tau_hours`` (a Betts-Miller-like reference profile:
        the pseudo-adiabat), and below it the sub-cloud layer cools by ``subcloud_cooling``
        (downdrafts); the parcel's own level is left alone. Moisture is diagnosed, not carried: the
        heating is the latent heat of rain that leaves the column."""
        cfg, g = self.cfg, self.grid
        humidity = self.surface_humidity(theta, time_s)
        parcel, saturated = lifted_parcel(theta[:, 0], humidity, g.p, g.exner)
        buoyancy = np.where(g.p >= cfg.cloud_top_hpa, parcel - theta * g.exner, 0.0)
        convects = (humidity >= cfg.moisture_threshold) & (buoyancy > 0).any(axis=1)
        heating = np.where(saturated, np.maximum(buoyancy, 0.0) / (cfg.convective_tau_hours * 3600.0),
                           -cfg.subcloud_cooling / DAY_S)
        heating[:, 0] = 0.0
        return np.where(convects[:, None], heating / g.exner, 0.0)

    def _advance_weather(self) -> None:
        cfg = self.cfg
        a = np.exp(-cfg.dt_s / (cfg.weather_memory_days * DAY_S))
        noise = self.rng.normal(size=(cfg.nlat, cfg.nlon))
        for _ in range(3):  # spatial smoothing: correlated over a few columns
            noise = (noise + np.roll(noise, 1, 1) + np.roll(noise, -1, 1)
                     + np.vstack([noise[:1], noise[:-1]]) + np.vstack([noise[1:], noise[-1:]])) / 5
        noise /= noise.std() + 1e-12
        field = noise.reshape(-1, 1)[self.columns] * self._level_shape
        self.weather = a * self.weather + np.sqrt(1 - a * a) * cfg.weather_std * field

    def _diffuse(self, theta: np.ndarray) -> np.ndarray:
        v = self.cfg.vertical_diffusion
        up = np.concatenate([theta[..., 1:], theta[..., -1:]], -1)
        down = np.concatenate([theta[..., :1], theta[..., :-1]], -1)
        return theta + v * (up + down - 2 * theta)

    def mix(self, theta: np.ndarray, south: np.ndarray | None = None,
            north: np.ndarray | None = None) -> np.ndarray:
        """Vertical diffusion and horizontal exchange of the block. ``south``/``north``
        are the neighbouring blocks' adjacent rows [nlon, levels] before mixing; None at
        a pole (no flux across it)."""
        cfg = self.cfg
        grid = self._diffuse(theta).reshape(len(self.rows), cfg.nlon, -1)
        s = grid[:1] if south is None else self._diffuse(south)[None]
        n = grid[-1:] if north is None else self._diffuse(north)[None]
        ext = np.concatenate([s, grid, n], 0)
        lap = np.roll(grid, 1, 1) + np.roll(grid, -1, 1) + ext[2:] + ext[:-2] - 4 * grid
        return (grid + cfg.horizontal_exchange * lap / 4).reshape(theta.shape)

    def convect(self, theta: np.ndarray) -> np.ndarray:
        """Dry convective adjustment: mix unstable layers to a common theta, exactly
        conserving each column's heat content sum(exner * theta * dp).

        Bottom-up, every column keeps a stack of mixed segments; each new
        layer is pushed and merged with the segment below while it is colder
        (in theta) by more than the tolerance. Vectorised over columns.
        """
        n, levels = theta.shape
        w = self.grid.exner
        tol = self.cfg.convective_tolerance + 1e-12
        start = np.zeros((n, levels), np.int64)
        wsum = np.zeros((n, levels))
        weight = np.zeros((n, levels))
        top = np.zeros(n, np.int64)
        rows = np.arange(n)
        for k in range(levels):
            start[rows, top] = k
            wsum[rows, top] = w[k] * theta[:, k]
            weight[rows, top] = w[k]
            top += 1
            while True:
                r = rows[top >= 2]
                t = top[r]
                upper = wsum[r, t - 1] / weight[r, t - 1]
                lower = wsum[r, t - 2] / weight[r, t - 2]
                merge = upper < lower - tol
                if not merge.any():
                    break
                r, t = r[merge], t[merge]
                wsum[r, t - 2] += wsum[r, t - 1]
                weight[r, t - 2] += weight[r, t - 1]
                top[r] -= 1
        active = np.arange(levels)[None, :] < top[:, None]
        marks = np.zeros((n, levels), np.int64)
        marks[np.nonzero(active)[0], start[active]] = 1
        segment = np.cumsum(marks, axis=1) - 1
        means = np.where(active, wsum / np.where(active, weight, 1.0), 0.0)
        return np.take_along_axis(means, segment, axis=1)

    def step(self, theta: np.ndarray, correction: np.ndarray | None = None,
             nudge_to: np.ndarray | None = None, nudge_tau_s: float = 3 * 3600.0,
             halos=None) -> tuple[np.ndarray, np.ndarray]:
        """One step of the block; returns (new theta, the nudging increment applied or zeros).

        ``correction`` is an added tendency (K/s) [columns, levels]; with
        ``nudge_to``, Newtonian relaxation ``(x_ref - x) / tau`` is applied too.
        ``halos(theta) -> (south, north)`` supplies the neighbouring blocks' edge
        rows of the updated state (None: this block is the whole grid).
        """
        nudge = np.zeros_like(theta) if nudge_to is None else (nudge_to - theta) / nudge_tau_s
        theta = self.tendency_update(theta, correction, nudge)
        south, north = (None, None) if halos is None else halos(theta)
        theta = self.convect(self.mix(theta, south, north))
        self._advance_weather()
        self.time_s += self.cfg.dt_s
        return theta, nudge

    def tendency_update(self, theta: np.ndarray, correction: np.ndarray | None = None,
                        nudge: np.ndarray | None = None) -> np.ndarray:
        """theta + dt * (physics + correction + nudging): the state whose edge rows a
        neighbouring block needs before it mixes."""
        tend = self.tendency(theta, self.time_s)
        for extra in (correction, nudge):
            if extra is not None:
                tend = tend + extra
        return theta + self.cfg.dt_s * tend

    # -- what a learnt correction sees ------------------------------------
    def features(self, theta: np.ndarray) -> np.ndarray:
        """[columns, levels, FEATURES] float32: theta, pressure and the relaxation
        tendency, each scaled to order one."""
        relax = (self.equilibrium(self.time_s) - theta) / self._tau * DAY_S
        p = np.broadcast_to(self.grid.p / 1000.0, theta.shape)
        return np.stack([(theta - 300.0) / 50.0, p, relax / 5.0], axis=-1).astype(np.float32)

    def context(self, theta: np.ndarray | None = None) -> np.ndarray:
        """[columns, ``cfg.context_size``] float32: where and when each column is (and, with
        ``surface_context``, its surface air's theta from ``theta``, scaled as the features' is)."""
        hour = self.local_hour(self.time_s)
        season = np.full_like(hour, 2 * np.pi * self.time_s / (365.0 * DAY_S))
        parts = [np.sin(self.col_lat), np.cos(self.col_lat), np.sin(hour), np.cos(hour), np.sin(season),
                 np.cos(season)]
        if self.cfg.surface_context:
            if theta is None:
                raise ValueError("this testbed's context carries the surface air: pass theta")
            parts.append((theta[:, 0] - 300.0) / 50.0)
        return np.stack(parts, axis=-1).astype(np.float32)

    def band_sums(self, field: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sum of area * field, sum of area) per band over this block's columns, for a
        reduction across blocks."""
        values = np.bincount(self.band, self.area * field, minlength=BANDS)
        weights = np.bincount(self.band, self.area, minlength=BANDS)
        return values, weights

    def initial_state(self, spin_up_days: float = 30.0) -> np.ndarray:
        theta = self.equilibrium(0.0)
        for _ in range(int(spin_up_days * DAY_S / self.cfg.dt_s)):
            theta, _ = self.step(theta)
        return theta
