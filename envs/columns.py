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

``ColumnConfig.truth()`` produces the analysis; ``ColumnConfig.model()`` has
systematic errors: a stronger equator-pole heating contrast, a shorter
relaxation time, and convection that tolerates a slightly unstable
profile. Diagnostics per latitude band: the height of the 500 hPa surface
from hydrostatic integration (a Z500 analogue) and T at 850 hPa.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

KAPPA = 0.2857
R_DRY = 287.0
GRAVITY = 9.81
DAY_S = 86400.0
BANDS = 6


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

    @classmethod
    def truth(cls, **kw) -> ColumnConfig:
        return cls(**kw)

    @classmethod
    def model(cls, **kw) -> ColumnConfig:
        return replace(cls(**kw), delta_t_y=70.0, tau_surface_days=3.0, tau_free_days=30.0,
                       convective_tolerance=0.5)

    @property
    def columns(self) -> int:
        return self.nlat * self.nlon


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
        return np.array([np.interp(-850.0, -self.p, t) for t in self.temperature(theta)]) \
            if theta.ndim == 1 else np.apply_along_axis(lambda t: np.interp(-850.0, -self.p, t), -1,
                                                        self.temperature(theta))

    def band_means(self, field):
        """Area-weighted mean of a per-column field in each of the 6 latitude bands."""
        w = self.area
        return np.array([np.sum(field[self.band == b] * w[self.band == b]) / np.sum(w[self.band == b])
                         for b in range(BANDS)])


class ColumnModel:
    """Steps a set of columns (all, or one rank's ``columns`` subset) of the grid."""

    def __init__(self, cfg: ColumnConfig, seed: int = 0, columns: np.ndarray | None = None):
        self.cfg = cfg
        self.grid = ColumnGrid(cfg)
        self.columns = np.arange(cfg.columns) if columns is None else np.asarray(columns)
        self.rng = np.random.default_rng(seed)
        self.weather = np.zeros((cfg.columns, cfg.levels))
        self.time_s = 0.0
        g = self.grid
        lat = g.col_lat[:, None]
        self._tau = DAY_S * (cfg.tau_free_days + (cfg.tau_surface_days - cfg.tau_free_days)
                             * np.clip((g.p - 700.0) / 295.0, 0, 1)[None, :] * np.cos(lat) ** 4)
        self._level_shape = np.exp(-((g.p - 500.0) / 250.0) ** 2)[None, :]

    # -- physics ---------------------------------------------------------
    def equilibrium(self, time_s: float) -> np.ndarray:
        cfg, g = self.cfg, self.grid
        season = np.deg2rad(23.5) * np.sin(2 * np.pi * time_s / (365.0 * DAY_S))
        lat = g.col_lat[:, None] - season
        log_p = np.log(g.p / 1000.0)[None, :]
        T = (315.0 - cfg.delta_t_y * np.sin(lat) ** 2 - cfg.delta_theta_z * log_p * np.cos(lat) ** 2) * g.exner
        local_hour = 2 * np.pi * (time_s / DAY_S) + g.col_lon[:, None]
        surface = np.clip((g.p - 800.0) / 195.0, 0, 1)[None, :]
        T = T + cfg.diurnal_amplitude * surface * np.cos(local_hour - np.pi) * np.cos(g.col_lat[:, None])
        return np.maximum(T, 200.0) / g.exner

    def tendency(self, theta: np.ndarray, time_s: float) -> np.ndarray:
        """Relaxation plus weather heating (K/s) for every column of the grid."""
        cfg, g = self.cfg, self.grid
        relax = (self.equilibrium(time_s) - theta) / self._tau
        waves = cfg.wave_amplitude / DAY_S * np.cos(3 * g.col_lon[:, None] - 2 * np.pi * time_s / (6 * DAY_S)) \
            * np.sin(2 * g.col_lat[:, None]) ** 2 * self._level_shape
        return relax + self.weather / DAY_S + waves

    def _advance_weather(self) -> None:
        cfg = self.cfg
        a = np.exp(-cfg.dt_s / (cfg.weather_memory_days * DAY_S))
        noise = self.rng.normal(size=(cfg.nlat, cfg.nlon))
        for _ in range(3):  # spatial smoothing: correlated over a few columns
            noise = (noise + np.roll(noise, 1, 1) + np.roll(noise, -1, 1)
                     + np.vstack([noise[:1], noise[:-1]]) + np.vstack([noise[1:], noise[-1:]])) / 5
        noise /= noise.std() + 1e-12
        field = noise.reshape(-1, 1) * self._level_shape
        self.weather = a * self.weather + np.sqrt(1 - a * a) * cfg.weather_std * field

    def mix(self, theta: np.ndarray) -> np.ndarray:
        """Vertical diffusion and horizontal exchange (full grid)."""
        cfg = self.cfg
        v = cfg.vertical_diffusion
        up = np.concatenate([theta[:, 1:], theta[:, -1:]], 1)
        down = np.concatenate([theta[:, :1], theta[:, :-1]], 1)
        theta = theta + v * (up + down - 2 * theta)
        grid = theta.reshape(cfg.nlat, cfg.nlon, -1)
        north = np.concatenate([grid[1:], grid[-1:]], 0)
        south = np.concatenate([grid[:1], grid[:-1]], 0)
        h = cfg.horizontal_exchange
        lap = np.roll(grid, 1, 1) + np.roll(grid, -1, 1) + north + south - 4 * grid
        return (grid + h * lap / 4).reshape(theta.shape)

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
             nudge_to: np.ndarray | None = None, nudge_tau_s: float = 3 * 3600.0) -> tuple[np.ndarray, np.ndarray]:
        """One step of the full grid; returns (new theta, the nudging increment applied or zeros).

        ``correction`` is an added tendency (K/s) [columns, levels]; with
        ``nudge_to``, Newtonian relaxation ``(x_ref - x) / tau`` is applied too.
        """
        dt = self.cfg.dt_s
        tend = self.tendency(theta, self.time_s)
        if correction is not None:
            tend = tend + correction
        nudge = np.zeros_like(theta) if nudge_to is None else (nudge_to - theta) / nudge_tau_s
        theta = self.convect(self.mix(theta + dt * (tend + nudge)))
        self._advance_weather()
        self.time_s += dt
        return theta, nudge

    def initial_state(self, spin_up_days: float = 30.0) -> np.ndarray:
        theta = self.equilibrium(0.0)
        for _ in range(int(spin_up_days * DAY_S / self.cfg.dt_s)):
            theta, _ = self.step(theta)
        return theta
