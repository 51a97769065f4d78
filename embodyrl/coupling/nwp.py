"""The column experiment: one MPI rank's parts (the library half of
``examples/nwp_column_correction.py``, whose ranks run ``mpiexec -n N python
examples/nwp_column_correction.py rank ARGS.json`` and call these phases).

Every rank owns a block of latitude rows (:func:`embodyrl.envs.columns.row_split`:
unequal column counts), steps it with halo rows from its neighbours, and holds its
own :class:`~embodyrl.hal.coupling.CouplingLink` per learner. In order:

1. **Analysis**: the truth configuration, spun up, then run through the whole
   period; each rank writes its own columns of every snapshot into one shared file.
2. **Nudged training** (:func:`train`): the model in forecasts nudged toward the
   analysis (``(x_ref - x) / tau``). Each step every seed's link gets the rank's
   columns and the nudging increment (K/day) as the target; the proposed
   correction is scored against it (discount 0) but not applied, since nudging
   would absorb it. The rank also sums the increment (the constant bias
   correction) and records a sample of (inputs, increment) for the offline
   baselines (ridge regression, a supervised MLP).
3. **Training on consequences** (:func:`train_free`): free forecasts from the
   analysis over the same period with the exploring policy's corrections
   applied, in windows of 3 h; each column's target is the tendency that would
   have kept its error from growing over the window, and its reward the policy's
   answer scored against it.
4. **Evaluation** (:func:`forecast_errors`): from start dates after the
   training period, free forecasts of every variant with the same stochastic
   forcing per start date; per start date, band sums of |error| of Z500 and
   T850, the global mean error (drift) and whether the forecast stayed bounded.
   Then a long free run with the default learnt correction.

Only diagnostics (sums, timings) are reduced to rank 0, after the fact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..envs.columns import BANDS, DAY_S, TESTBEDS, ColumnConfig, ColumnModel, row_split
from ..hal.coupling.link import CouplingConfig, CouplingLink

BAND_NAMES = ["90S-60S", "60S-30S", "30S-0", "0-30N", "30N-60N", "60N-90N"]
VARIANTS = ("native", "bias_corrected", "ridge", "polynomial", "mlp", "rl_nudged", "rl_free")
"""Every way of correcting the model, in the order they are evaluated: none; the mean nudging
increment per column and level; a ridge regression, a polynomial of degree 2 and an MLP fitted
offline to the recorded increments; online DDPG scored against the increment (discount 0); online
DDPG on free forecasts, rewarded by the error over the next steps."""
OFFLINE = ("bias_corrected", "ridge", "polynomial", "mlp")
"""The variants fitted offline, which learning from consequences is judged against."""
SEEDED = ("mlp", "rl_nudged", "rl_free")
"""The variants trained from a random initialisation, evaluated for every seed (ridge is a closed form)."""
FIELDS = ("z500", "t850")
DEFAULT_VARIANT = "rl_nudged"
"""The variant the top-level keys of ``results.json`` (``corrected_*``, ``stable``) describe."""


QUICK = dict(nlat=8, nlon=16, spin_up_days=3.0, train_starts_days=(0.0, 1.0), train_days=1.0,
             free_starts_days=(0.0, 1.0), free_days=1.0, eval_starts_days=(2.25, 2.75), seeds=2,
             lead_hours=(6, 24, 72), free_run_days=2.0, climate_days=2.0, stream_fraction=0.25, stream_every=1,
             send_every=8)
"""A small grid and short periods (tests); a quarter of the columns every step, so that the learner
gets enough steps to start."""


@dataclass(frozen=True)
class ExperimentConfig:
    testbed: str = "mistuned"
    """Which truth and model (:data:`~embodyrl.envs.columns.TESTBEDS`): ``mistuned`` parameters, or
    ``moist`` convection the model lacks."""
    nlat: int = 32
    nlon: int = 64
    spin_up_days: float = 10.0
    """Truth spin-up before the analysis period starts."""
    train_starts_days: tuple[float, ...] = (0.0, 2.0, 4.0, 6.0)
    """Start dates (days into the analysis period) of the nudged training forecasts."""
    train_days: float = 2.0
    free_starts_days: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0)
    """Start dates of the free training forecasts (the same period as the nudged ones)."""
    free_days: float = 1.0
    free_start: str = "mlp"
    """The variant whose seed-N policy starts ``rl_free/sN`` (its actor and target; ``""``: a random
    initialisation): training on consequences refines a policy that already corrects. ``"bias"``:
    ``rl_free`` corrects on top of the constant bias correction (the mean nudging increment per
    column and level), and its policy, the learnt residual, starts at zero: learning from
    consequences starts from the best offline fit past a day and learns only what it lacks."""
    free_actor_lr: float = 1e-4
    """The free-forecast learner's actor step: a tenth of the nudged one's, so that a critic still
    learning the consequences moves the warm-started actor slowly."""
    free_bc_weight: float = 25.0
    """Behaviour cloning in the free-forecast learner's actor loss (``ddpg.bc_weight``): the actions
    that acted, the warm start's plus exploration, hold the actor near the policy it started from
    while its critic learns what the corrections lead to. TD3+BC's 0.4 made the moist testbed's
    forecasts worse than none (the normalised Q's gradient outweighs it); 2.5 and 25 less so
    (docs/coupling.md)."""
    free_window: int = 6
    """Steps of one consequence window (3 h, one analysis interval): each window of a free forecast
    gives every column the target :func:`train_free` computes from the window's error growth."""
    free_actor_starts_after: int = 1000
    """Critic steps before the free-forecast learner's actor moves (``ddpg.actor_starts_after``): the
    warm start is not moved by a critic fitted to the first window's rows."""
    eval_starts_days: tuple[float, ...] = tuple(8.5 + i for i in range(12))
    """Start dates of the evaluation forecasts: after the training period, never trained on."""
    lead_hours: tuple[int, ...] = (6, 12, 24, 72, 120)
    seeds: int = 3
    """Seeds of every variant in SEEDED."""
    free_run_days: float = 10.0
    """Length of the free run with the learnt correction (stability)."""
    climate_days: float = 30.0
    """Length of each climate run (:func:`climate_run`): the truth's and each system's, from one state."""
    nudge_tau_h: float = 3.0
    analysis_every: int = 6
    """Model steps between analysis snapshots (3 h)."""
    max_correction: float = 3.0
    """Bound of the learnt correction (K/day)."""
    radius: int = 2
    stream_fraction: float = 0.5
    """Fraction of a rank's columns streamed on a streaming step (round by round: each column
    once before any again)."""
    stream_every: int = 8
    """Steps between streaming steps: half the columns every 8th step streams a sixteenth of the
    column steps (49152 on 4 ranks; a quarter of the columns every step, this session's earlier
    setting, streamed a quarter, 196608), and pays the link's fixed cost per streaming step once
    per 8 steps. The learning goals held with it (docs/coupling.md)."""
    send_every: int = 2
    """Streaming steps whose columns go out in one STEPS message (one every 16 steps)."""
    compression: str = "off"
    """Step batches' compression: the ranks and the learner share one machine, where none pays."""
    policy_wait_s: float = 3600.0
    """How long ranks wait for the learner's final policy before evaluating without it."""

    def __post_init__(self):
        if self.testbed not in TESTBEDS:
            raise ValueError(f"testbed {self.testbed!r} is not one of {sorted(TESTBEDS)}")

    @classmethod
    def moist(cls, **kw) -> ExperimentConfig:
        """The ``moist`` testbed's experiment: nudged toward the analysis over 1 h (a nudging lag of
        3 h smooths the missing process's switches out of the increments), corrections up to
        10 K/day (convection heats by several)."""
        return cls(**{"testbed": "moist", "nudge_tau_h": 1.0, "max_correction": 10.0, **kw})

    @classmethod
    def quick(cls) -> ExperimentConfig:
        return cls(**QUICK)

    def configs(self):
        """(truth, model) :class:`~embodyrl.envs.columns.ColumnConfig` of this grid."""
        truth, model = TESTBEDS[self.testbed]
        return truth(nlat=self.nlat, nlon=self.nlon), model(nlat=self.nlat, nlon=self.nlon)

    @property
    def free_on_bias(self) -> bool:
        """``rl_free`` is a residual on the constant bias correction (``free_start`` ``"bias"``)."""
        return self.free_start == "bias"

    def coupling(self, free: bool = False) -> CouplingConfig:
        """The links' configuration; ``free``: training on free forecasts, where only the exchanges
        that carry a window's targets stream, every column of them."""
        _, cfg = self.configs()
        return CouplingConfig(levels=cfg.levels, features=ColumnModel.FEATURES, context=cfg.context_size,
                              radius=self.radius, max_correction=self.max_correction,
                              stream_fraction=1.0 if free else self.stream_fraction,
                              stream_every=1 if free else self.stream_every, send_every=self.send_every,
                              compression=self.compression)

    def members(self) -> list[str]:
        """Every evaluated forecast system: ``variant`` or ``variant/sN`` for the seeded ones."""
        return [f"{v}/s{s}" if v in SEEDED else v for v in VARIANTS for s in range(self.seeds if v in SEEDED else 1)]

    @property
    def period_days(self) -> float:
        return max(max(self.train_starts_days) + self.train_days, max(self.free_starts_days) + self.free_days,
                   max(self.eval_starts_days) + max(self.lead_hours) / 24.0)


class Rank:
    """One rank's block of the grid and its MPI neighbours."""

    def __init__(self, exp: ExperimentConfig, comm):
        self.exp, self.comm = exp, comm
        self.truth_cfg, self.model_cfg = exp.configs()
        self.rows = row_split(exp.nlat, comm.size)[comm.rank]
        self.dt = self.truth_cfg.dt_s
        self.timing = new_timing()

    def model(self, cfg: ColumnConfig, seed: int) -> ColumnModel:
        return ColumnModel(cfg, seed=seed, rows=self.rows)

    def halos(self, theta: np.ndarray):
        """Edge rows to and from the neighbouring blocks (rank order is latitude order)."""
        from mpi4py import MPI

        comm, nlon, r = self.comm, self.exp.nlon, self.comm.rank
        south = np.empty((nlon, theta.shape[1])) if r > 0 else None
        north = np.empty((nlon, theta.shape[1])) if r < comm.size - 1 else None
        first, last = np.ascontiguousarray(theta[:nlon]), np.ascontiguousarray(theta[-nlon:])
        requests = []
        if south is not None:
            requests += [comm.Isend(first, r - 1, tag=1), comm.Irecv(south, r - 1, tag=2)]
        if north is not None:
            requests += [comm.Isend(last, r + 1, tag=2), comm.Irecv(north, r + 1, tag=1)]
        t0, c0 = time.perf_counter(), time.thread_time()
        MPI.Request.Waitall(requests)
        self.timing["halo_wait_s"] += time.perf_counter() - t0
        self.timing["halo_wait_cpu_s"] += time.thread_time() - c0
        return south, north

    def step(self, model, theta, **kw):
        t0, c0 = time.perf_counter(), time.thread_time()
        out = model.step(theta, halos=self.halos, **kw)
        self.timing["model_s"] += time.perf_counter() - t0
        self.timing["model_cpu_s"] += time.thread_time() - c0
        self.timing["steps"] += 1
        return out


def new_timing() -> dict:
    """A rank's clocks for one phase: the model step (physics and halo exchange; ``halo_wait``, the
    part spent in ``MPI_Waitall``, is also kept apart) and building the features, each as wall time
    and as the rank thread's CPU time."""
    return {"model_s": 0.0, "model_cpu_s": 0.0, "halo_wait_s": 0.0, "halo_wait_cpu_s": 0.0,
            "feature_s": 0.0, "feature_cpu_s": 0.0, "steps": 0}


def make_analysis(rank: Rank, path: Path) -> None:
    """Truth spin-up, then every ``analysis_every``-th state of the period into ``path``."""
    exp, comm = rank.exp, rank.comm
    truth = rank.model(rank.truth_cfg, seed=0)
    per_day = int(DAY_S / rank.dt)
    snapshots = int(round(exp.period_days * per_day / exp.analysis_every)) + 1
    if comm.rank == 0:
        np.lib.format.open_memmap(path, "w+", np.float32,
                                (snapshots, rank.truth_cfg.columns, rank.truth_cfg.levels)).flush()
    comm.Barrier()
    store = np.load(path, mmap_mode="r+")
    theta = truth.equilibrium(0.0)
    for _ in range(int(exp.spin_up_days * per_day)):
        theta, _ = rank.step(truth, theta)
    for s in range(snapshots):
        store[s, truth.columns] = theta
        if s < snapshots - 1:
            for _ in range(exp.analysis_every):
                theta, _ = rank.step(truth, theta)
    store.flush()
    comm.Barrier()


class Analysis:
    """This rank's columns of the analysis, interpolated linearly between snapshots."""

    def __init__(self, rank: Rank, path: Path):
        self.every = rank.exp.analysis_every
        self.start_s = rank.exp.spin_up_days * DAY_S
        self.dt = rank.dt
        self.columns = ColumnModel(rank.truth_cfg, rows=rank.rows).columns
        self.data = np.load(path, mmap_mode="r")

    def at_step(self, k: int) -> np.ndarray:
        s, frac = divmod(k, self.every)
        a = self.data[s, self.columns].astype(np.float64)
        if frac == 0:
            return a
        b = self.data[s + 1, self.columns].astype(np.float64)
        return a + (b - a) * frac / self.every

    def step_of(self, day: float) -> int:
        return int(round(day * DAY_S / self.dt))


def train(rank: Rank, analysis: Analysis, links: list[CouplingLink], record: Path | None = None) -> np.ndarray:
    """Nudged forecasts from every training start, every seed's link scoring the same steps; returns
    the mean nudging increment (K/day). With ``record``, a sample of (profile, context, increment)
    at the streaming rate (a ``stream_fraction`` of the columns every ``stream_every`` steps) goes
    to ``record`` (npz) for the offline baselines."""
    exp = rank.exp
    tau = exp.nudge_tau_h * 3600.0
    total, count = 0.0, 0
    rng = np.random.default_rng(1000 + rank.comm.rank)
    kept: dict[str, list] = {"profile": [], "context": [], "increment": [], "start": []}
    for i, day in enumerate(exp.train_starts_days):
        model = rank.model(rank.model_cfg, seed=100 + i)
        k0 = analysis.step_of(day)
        model.time_s = analysis.start_s + k0 * rank.dt
        theta = analysis.at_step(k0)
        for k in range(int(exp.train_days * DAY_S / rank.dt)):
            reference = analysis.at_step(k0 + k)
            increment = (reference - theta) / tau * DAY_S
            state, context = features_of(rank, model, theta)
            for link in links:
                link.exchange(state, {"context": context, "target": increment})
            if record is not None and k % exp.stream_every == 0:
                n = len(theta)
                rows = rng.choice(n, max(1, int(round(exp.stream_fraction * n))), replace=False)
                for name, value in (("profile", state[rows]), ("context", context[rows]),
                                    ("increment", increment[rows].astype(np.float32)),
                                    ("start", np.full(len(rows), i))):
                    kept[name].append(value)
            total, count = total + increment, count + 1
            theta, _ = rank.step(model, theta, nudge_to=reference, nudge_tau_s=tau)
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        np.savez(record, **{name: np.concatenate(values) for name, values in kept.items()})
    return total / count


def train_free(rank: Rank, analysis: Analysis, link: CouplingLink, offset: np.ndarray | float = 0.0) -> None:
    """Free forecasts from the analysis at every free training start, the exploring policy's corrections
    applied, in windows of ``free_window`` steps. At each window's end every column gets the target of
    its consequences: the mean correction applied over the window, less the growth of its error
    against the analysis over the window per day,

        target = mean_j a_j - ((x_end - x_end^a) - (x_start - x_start^a)) / window,

    the tendency that would have kept the window's error where it started (the model error of the
    states this policy's own forecasts visit, corrections included). The link then scores its
    policy's answer on the window's first state against that target, as the nudged phase scores one
    against the nudging increment; that exchange streams and is not applied. Growth, not the error
    itself: a window is not asked to undo the error that earlier windows left.

    ``offset`` (K/day, per column and level) is added to every answer applied: the policy is then a
    residual on top of it, and its target the tendency the window lacked beyond the offset."""
    exp = rank.exp
    window, window_days = exp.free_window, exp.free_window * rank.dt / DAY_S
    for i, day in enumerate(exp.free_starts_days):
        model = rank.model(rank.model_cfg, seed=300 + i)
        k0 = analysis.step_of(day)
        model.time_s = analysis.start_s + k0 * rank.dt
        theta = analysis.at_step(k0)
        for w0 in range(0, int(exp.free_days * DAY_S / rank.dt) - window + 1, window):
            error = theta - analysis.at_step(k0 + w0)
            applied = np.zeros_like(theta)
            for j in range(window):
                state, context = features_of(rank, model, theta)
                if j == 0:
                    first = state, context  # the window's first state: its target's row
                answer = link.exchange(state, {"context": context})
                applied += answer
                theta, _ = rank.step(model, theta, correction=(answer + offset) / DAY_S)
            growth = theta - analysis.at_step(k0 + w0 + window) - error
            link.exchange(first[0], {"context": first[1], "target": applied / window - growth / window_days})


def features_of(rank: Rank, model: ColumnModel, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(profile features, context) of the state, timed as the rank's feature work."""
    t0, c0 = time.perf_counter(), time.thread_time()
    out = model.features(theta), model.context(theta)
    rank.timing["feature_s"] += time.perf_counter() - t0
    rank.timing["feature_cpu_s"] += time.thread_time() - c0
    return out


def bounded(theta: np.ndarray) -> bool:
    """Finite and physical (a forecast beyond this has blown up)."""
    return bool(np.isfinite(theta).all() and theta.min() > 150 and theta.max() < 2000)


def forecast_errors(rank: Rank, analysis: Analysis, correct) -> dict[str, np.ndarray]:
    """One forecast system's free forecasts from every evaluation start date.

    ``correct(model, theta)`` gives the correction (K/day) or None. Returns this rank's sums:
    ``abs`` [starts, leads, 2 (z500, t850), bands] of area x |error|, ``signed`` [starts, leads, 2]
    of area x error over all its columns, ``unbounded`` [starts] (1 where the forecast left
    :func:`bounded`; its sums then stop), and ``weights`` [bands] of area. The stochastic forcing of
    start i is the same for every system (paired comparisons)."""
    exp = rank.exp
    leads = [int(h * 3600 / rank.dt) for h in exp.lead_hours]
    n = len(exp.eval_starts_days)
    out = {"abs": np.zeros((n, len(leads), 2, BANDS)), "signed": np.zeros((n, len(leads), 2)),
           "unbounded": np.zeros(n), "weights": np.zeros(BANDS)}
    for i, day in enumerate(exp.eval_starts_days):
        k0 = analysis.step_of(day)
        model = rank.model(rank.model_cfg, seed=500 + i)
        model.time_s = analysis.start_s + k0 * rank.dt
        theta = analysis.at_step(k0)
        g, ok = model.grid, True
        for k in range(1, max(leads) + 1):
            correction = correct(model, theta) if ok else None  # a blown-up state is not corrected
            theta, _ = rank.step(model, theta, correction=None if correction is None else correction / DAY_S)
            ok = ok and bounded(theta)
            if k in leads and ok:
                ref = analysis.at_step(k0 + k)
                for j, field in enumerate((g.z500, g.t850)):
                    error = field(theta) - field(ref)
                    value, out["weights"] = model.band_sums(np.abs(error))
                    out["abs"][i, leads.index(k), j] = value
                    out["signed"][i, leads.index(k), j] = np.sum(model.area * error)
        out["unbounded"][i] = 0.0 if ok else 1.0
    return out


def free_run(rank: Rank, analysis: Analysis, link: CouplingLink) -> dict:
    """The learnt correction in a long non-nudged run: finite, physical, corrections within bounds."""
    exp = rank.exp
    model = rank.model(rank.model_cfg, seed=900)
    k0 = analysis.step_of(exp.eval_starts_days[0])
    model.time_s = analysis.start_s + k0 * rank.dt
    theta = analysis.at_step(k0)
    z0 = model.band_sums(model.grid.z500(theta))[0]
    largest, finite = 0.0, True
    for _ in range(int(exp.free_run_days * DAY_S / rank.dt)):
        correction = None
        if finite:  # a blown-up state is not sent to the link; every rank keeps stepping (halos)
            correction = link.exchange(model.features(theta), {"context": model.context(theta)}) / DAY_S
            largest = max(largest, float(np.abs(correction).max()) * DAY_S)
        theta, _ = rank.step(model, theta, correction=correction)
        finite = finite and bounded(theta)
    z1 = model.band_sums(model.grid.z500(theta))[0] if finite else np.full(BANDS, np.nan)
    return {"finite": finite, "largest_correction": largest, "z500_sum_start": z0, "z500_sum_end": z1,
            "theta_min": float(theta.min()), "theta_max": float(theta.max())}


CLIMATE_BINS = np.arange(180.0, 320.5, 1.0)
"""Edges (K) of the T850 histograms of the climate runs."""
CLIMATE_SEED = 900
"""The weather realisation of every climate run, the truth's included (paired)."""


def climate_run(rank: Rank, analysis: Analysis, cfg: ColumnConfig, correct) -> dict[str, np.ndarray]:
    """A free run of ``climate_days`` of ``cfg`` (the truth's, or the model's with ``correct(model, theta)``,
    K/day or None) from the analysis at the first evaluation start date, every run with the same weather.
    This rank's sums every ``analysis_every`` steps (3 h): ``series`` [samples, bands] of area x band-mean
    T850, ``weights`` [bands] of area, ``hist`` [bands, bins] of area by T850 (:data:`CLIMATE_BINS`), and
    ``bounded`` (0 where the run left :func:`bounded`; its sums stop there)."""
    exp = rank.exp
    model = rank.model(cfg, seed=CLIMATE_SEED)
    k0 = analysis.step_of(exp.eval_starts_days[0])
    model.time_s = analysis.start_s + k0 * rank.dt
    theta = analysis.at_step(k0)
    samples = int(exp.climate_days * DAY_S / rank.dt) // exp.analysis_every
    out = {"series": np.zeros((samples, BANDS)), "weights": np.zeros(BANDS),
           "hist": np.zeros((BANDS, len(CLIMATE_BINS) - 1)), "bounded": np.ones(1)}
    ok = True
    for k in range(1, samples * exp.analysis_every + 1):
        correction = correct(model, theta) if ok and correct is not None else None
        theta, _ = rank.step(model, theta, correction=None if correction is None else correction / DAY_S)
        ok = ok and bounded(theta)
        if k % exp.analysis_every == 0 and ok:
            t850 = model.grid.t850(theta)
            out["series"][k // exp.analysis_every - 1], out["weights"] = model.band_sums(t850)
            for b in range(BANDS):
                inside = model.band == b
                out["hist"][b] += np.histogram(t850[inside], CLIMATE_BINS, weights=model.area[inside])[0]
    out["bounded"][0] = float(ok)
    return out


def climate_statistics(series: np.ndarray, hist: np.ndarray, truth_series: np.ndarray, truth_hist: np.ndarray,
                       samples_per_day: int, block_days: int = 5, resamples: int = 2000) -> dict:
    """Per band, a system's climate against the truth's (band-mean T850 ``series`` [samples, bands] and the
    columns' T850 ``hist`` [bands, bins], the truth's alike): the mean, standard deviation and lag-1-day
    autocorrelation of the band mean, the mean error against the truth's paired run with a 95 % interval
    from a moving-block bootstrap over days (``block_days`` blocks), and the Hellinger distance between
    the two T850 distributions (0: the same; 1: disjoint)."""
    def autocorrelation(x):
        a, b = x[:-samples_per_day] - x.mean(), x[samples_per_day:] - x.mean()
        return float(np.sum(a * b) / np.sqrt(np.sum(a * a) * np.sum(b * b))) if len(a) > 1 else float("nan")

    rng = np.random.default_rng(0)
    block = block_days * samples_per_day
    starts = np.arange(max(len(series) - block + 1, 1))
    n_blocks = max(len(series) // block, 1)
    picks = rng.choice(starts, (resamples, n_blocks))
    bands = []
    for b in range(series.shape[1]):
        diff = series[:, b] - truth_series[:, b]
        means = np.array([np.mean(np.concatenate([diff[s:s + block] for s in row])) for row in picks])
        p, q = hist[b] / max(hist[b].sum(), 1e-300), truth_hist[b] / max(truth_hist[b].sum(), 1e-300)
        bands.append({"mean": float(series[:, b].mean()), "truth_mean": float(truth_series[:, b].mean()),
                      "std": float(series[:, b].std()), "truth_std": float(truth_series[:, b].std()),
                      "autocorrelation_1day": autocorrelation(series[:, b]),
                      "truth_autocorrelation_1day": autocorrelation(truth_series[:, b]),
                      "mean_error": float(diff.mean()),
                      "mean_error_ci95": [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))],
                      "hellinger": float(np.sqrt(max(0.0, 1.0 - np.sum(np.sqrt(p * q)))))})
    return {"bands": bands, "hellinger_mean": float(np.mean([b["hellinger"] for b in bands]))}


GOAL_LEADS = (24, 72)
GOAL_REDUCTION = 0.20
GOAL_BASELINES = ("bias_corrected", "ridge", "polynomial")


def _lead_checks(by_variant: dict, exp: ExperimentConfig, variant: str, baselines) -> list[dict]:
    """Per goal lead, field and baseline: ``variant``'s area-weighted MAE reduction and whether the
    intervals are apart."""
    rows = []
    for h in (h for h in GOAL_LEADS if h in exp.lead_hours):
        li = exp.lead_hours.index(h)
        for field in FIELDS:
            mine = by_variant[variant]["by_lead"][li]["area_weighted"][field]
            for baseline in baselines:
                if baseline not in by_variant:
                    continue
                theirs = by_variant[baseline]["by_lead"][li]["area_weighted"][field]
                reduction = 1.0 - mine["mean"] / theirs["mean"]
                separated = mine["ci95"][1] < theirs["ci95"][0]
                rows.append({"lead_hours": h, "field": field, "baseline": baseline, "reduction": reduction,
                             "intervals_separate": separated,
                             "met": bool(reduction >= GOAL_REDUCTION and separated)})
    return rows


def goals(by_variant: dict, exp: ExperimentConfig) -> dict:
    """Whether the best learnt variant beats the constant bias correction, ridge regression and the
    polynomial by ``GOAL_REDUCTION`` on area-weighted Z500 and T850 MAE at +24 h and +72 h, with intervals
    that do not overlap; whether learning from consequences (``rl_free``) beats every offline fit at those
    leads (a lower mean, intervals apart); whether every forecast stayed bounded to the last lead."""
    checks = {}
    for variant in SEEDED:
        if variant not in by_variant:
            continue
        rows = _lead_checks(by_variant, exp, variant, GOAL_BASELINES)
        checks[variant] = {"met": bool(rows) and all(r["met"] for r in rows),
                           "worst_reduction": min((r["reduction"] for r in rows), default=float("-inf")),
                           "checks": rows}
    best = max(checks, key=lambda v: (checks[v]["met"], checks[v]["worst_reduction"]), default=None)
    consequences = None
    if "rl_free" in by_variant:
        rows = _lead_checks(by_variant, exp, "rl_free", OFFLINE)
        consequences = {"met": bool(rows) and all(r["reduction"] > 0 and r["intervals_separate"] for r in rows),
                        "worst_reduction": min((r["reduction"] for r in rows), default=float("-inf")),
                        "checks": rows}
    return {"beats_offline_fits_by_20_percent": {"baselines": list(GOAL_BASELINES), "best_learnt_variant": best,
                                                 "met": bool(best is not None and checks[best]["met"]),
                                                 "by_variant": checks},
            "consequences_beat_every_offline_fit": consequences,
            "all_forecasts_bounded": all(v["bounded_fraction"] == 1.0 for v in by_variant.values()),
            "bounded_to_hours": max(exp.lead_hours)}
