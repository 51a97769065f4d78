"""Lorenz-96 with the same coupling: a learnt correction for the one-scale model.

The library half of ``examples/lorenz96_correction.py`` (which plots and has
the command line)::

    python examples/lorenz96_correction.py --out runs/l96 [--quick]

The two-scale system (:mod:`embodyrl.envs.lorenz96`) is the truth; the
one-scale model lacks the fast variables' feedback ``-(h c / b) sum_j Y``.
Each site k of each forecast is one "column" of the link (one level; its
features are the model's periodic stencil ``X_{k-2..k+2}``, scaled), so the
model calls :class:`~embodyrl.hal.coupling.CouplingLink` exactly as a
column model does. Training: model forecasts nudged toward truth
trajectories (``(x_truth - x) / tau``), the nudging increment the target of
the reward, discount 0, the :class:`~embodyrl.coupling.CouplingLearner` in a
thread of this process. The same (stencil, increment) pairs, recorded, fit
the offline baselines (:func:`fit_baselines`): ridge on the stencil, a
polynomial of degree 2 of it and the offline MLP (exported and run through
the same link), and Wilks (2005)'s parametrisation, a quartic polynomial of
the site's own X_k, deterministic and with its residual's AR(1) noise
added. The last training forecast is held out to score each fit and the gap
check (:func:`~embodyrl.coupling.baselines.gap_check`). Evaluation:
forecasts from truth states not used in training, RMSE against the truth
versus lead time, for every variant. :func:`run` writes
``DIR/l96_results.json``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..envs import lorenz96 as L
from ..hal.coupling.link import CouplingConfig, CouplingLink
from ..hal.runtime import NumpyPolicy
from ..hal.steps import PolicyVersion


@dataclass(frozen=True)
class L96Experiment:
    train_forecasts: int = 16
    train_time: float = 6.0
    """Model time units of each nudged training forecast."""
    eval_forecasts: int = 24
    lead_time: float = 2.0
    """Longest lead (model time units) of the evaluation forecasts."""
    nudge_tau: float = 0.02
    stencil: int = 2
    """Sites on each side in a site's features."""
    max_correction: float = 20.0
    """Bound of the correction (X per time unit); the missing term reaches about 15."""
    stream_fraction: float = 0.5
    updates: int = 3000
    mlp_steps: int = 8000
    """Adam steps of the offline MLP."""
    seed: int = 0

    @classmethod
    def quick(cls) -> L96Experiment:
        return cls(train_forecasts=4, train_time=1.0, eval_forecasts=4, lead_time=0.5, updates=200, mlp_steps=300)

    def coupling(self) -> CouplingConfig:
        return CouplingConfig(levels=1, features=2 * self.stencil + 1, context=0, radius=0,
                              max_correction=self.max_correction, stream_fraction=self.stream_fraction)


def stencil(x: np.ndarray, width: int) -> np.ndarray:
    """[forecasts * K, 1 level, 2 width + 1]: each site's periodic neighbourhood, scaled by 1/10."""
    shifts = [np.roll(x, -s, axis=-1) for s in range(-width, width + 1)]
    return (np.stack(shifts, axis=-1) / 10.0).reshape(-1, 1, 2 * width + 1)


WILKS_DEGREE = 4


def fit_wilks(x: np.ndarray, increment: np.ndarray, dt: float) -> dict:
    """Wilks (2005): the increment as a quartic polynomial of the site's own X_k, least squares, and
    its residual as AR(1) noise over model steps (``x``, ``increment``: [steps, forecasts, K]).
    {"coefficients" (highest power first), "phi", "sigma", "dt"}."""
    coefficients = np.polyfit(x.reshape(-1), increment.reshape(-1), WILKS_DEGREE)
    residual = increment - np.polyval(coefficients, x)
    phi = float(np.sum(residual[1:] * residual[:-1]) / np.sum(residual[:-1] ** 2))
    return {"coefficients": coefficients.tolist(), "phi": phi, "sigma": float(residual.std()), "dt": dt}


class WilksCorrection:
    """Wilks's parametrisation as a forecast applies it: the quartic of X_k, plus (``noise``) an AR(1)
    residual per site with the fitted memory and spread."""

    def __init__(self, fit: dict, noise: bool, seed: int = 0):
        self.fit, self.noise, self._rng, self._e = fit, noise, np.random.default_rng(seed), None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        u = np.polyval(self.fit["coefficients"], x)
        if not self.noise:
            return u
        phi, sigma = self.fit["phi"], self.fit["sigma"]
        z = self._rng.normal(size=x.shape)
        self._e = sigma * z if self._e is None else phi * self._e + sigma * np.sqrt(1 - phi * phi) * z
        return u + self._e


def fit_baselines(increments, stencils: np.ndarray, x: np.ndarray, exp: L96Experiment, coupling: CouplingConfig,
                  cfg: L.L96Config) -> tuple[dict, dict]:
    """The offline fits on the recorded nudged steps (``increments`` [steps, forecasts, K], ``stencils``
    [steps, forecasts * K, 1, window], ``x`` [steps, forecasts, K]), the last training forecast held out:
    ({name: correction(x) -> tendency}, report with each fit's held-out R2 and the gap check)."""
    from . import baselines as B
    from .learner import CouplingLearnerConfig

    steps, forecasts, K = increments.shape
    start = np.broadcast_to(np.repeat(np.arange(forecasts), K)[None, :], (steps, forecasts * K))
    data = B.Increments(stencils.reshape(-1, 1, coupling.features), np.zeros((steps * forecasts * K, 0), np.float32),
                        increments.reshape(-1, 1).astype(np.float32), start.reshape(-1))
    last = forecasts - 1
    fit, held = data.where(data.start < last), data.where(data.start == last)
    w, b, ridge = B.fit_ridge_validated(fit, held, coupling)
    pw, pb, poly = B.fit_ridge_validated(fit, held, coupling, degree=2)
    wilks_fit = fit_wilks(x[:, :last], increments[:, :last], cfg.model_dt)
    wilks_r2 = B.r2(np.polyval(wilks_fit["coefficients"], x[:, last]), increments[:, last])
    ddpg = replace(CouplingLearnerConfig().ddpg, batch_size=256)
    networks, params = B.fit_mlp(fit, coupling, ddpg, seed=exp.seed, steps=exp.mlp_steps)
    mlp_r2 = B.r2(B.mlp_predict(networks, params, held), held.increment)
    networks, params = B.fit_mlp(data, coupling, ddpg, seed=exp.seed, steps=exp.mlp_steps)
    wilks = fit_wilks(x, increments, cfg.model_dt)
    version = PolicyVersion(1, 1)
    frozen = replace(coupling, explore=False)
    links = {"ridge": B.ridge_policy(coupling, w, b, version),
             "polynomial": B.ridge_policy(coupling, pw, pb, version, degree=2),
             "mlp": B.mlp_policy(networks, params, ddpg, version)}
    corrections = {name: _through_link(frozen, export, exp.stencil) for name, export in links.items()}
    corrections["wilks"] = WilksCorrection(wilks, noise=False)
    corrections["wilks_ar1"] = WilksCorrection(wilks, noise=True, seed=exp.seed)
    gap = B.gap_check(mlp_r2, {"ridge": ridge["r2_heldout"], "polynomial": poly["r2_heldout"], "wilks": wilks_r2})
    report = {"ridge_r2_heldout": ridge["r2_heldout"], "polynomial_r2_heldout": poly["r2_heldout"],
              "wilks_r2_heldout": wilks_r2, "mlp_r2_heldout": mlp_r2, "wilks": wilks, "gap": gap,
              "increment_std": float(held.increment.std()), "mlp_steps": exp.mlp_steps}
    return corrections, report


def _through_link(coupling: CouplingConfig, export, width: int):
    link = CouplingLink(coupling, rank=0, policy=NumpyPolicy(*export))
    return lambda x: link.exchange(stencil(x, width)).reshape(x.shape)


def run(exp: L96Experiment, out: Path) -> dict:
    from .learner import CouplingLearner, CouplingLearnerConfig  # JAX: only where the learner runs

    cfg = L.L96Config()
    rng = np.random.default_rng(exp.seed)
    n_train, n_eval = exp.train_forecasts, exp.eval_forecasts
    x0, y0 = L.spin_up(cfg, rng, n=n_train + n_eval, time=3.0)
    train_steps = int(round(exp.train_time / cfg.model_dt))
    truth, _ = L.truth_trajectory(x0[:n_train], y0[:n_train], cfg, train_steps)

    coupling = exp.coupling()
    learner = CouplingLearner(coupling, CouplingLearnerConfig(
        ddpg=replace(CouplingLearnerConfig().ddpg, batch_size=256), min_steps=1000, seed=exp.seed),
        metrics_dir=out / "metrics")
    done = threading.Event()
    thread = threading.Thread(target=learner.run, args=(3600.0, lambda: done.is_set()
                                                        and learner.updates >= exp.updates), daemon=True)
    learner.warm_up()
    thread.start()
    link = CouplingLink(replace(coupling, learner=learner.endpoint, connect_timeout_s=60.0, peer_timeout_s=60.0),
                        rank=0, policy=NumpyPolicy(*learner.export(), seed=exp.seed), seed=exp.seed)
    x, states, increments = truth[0].copy(), [], []
    t0 = time.perf_counter()
    for t in range(train_steps):
        nudge = (truth[t] - x) / exp.nudge_tau
        link.exchange(stencil(x, exp.stencil), {"target": nudge.reshape(-1, 1)})
        states.append(x)
        increments.append(nudge)
        x = L.model_step(x, cfg, correction=nudge)
    link.close(flush_s=30.0)
    done.set()
    thread.join(timeout=1800)
    train_s = time.perf_counter() - t0
    states, increments = np.stack(states), np.stack(increments)
    bias = float(np.mean(increments))  # every site alike by symmetry: one constant
    fitted, baselines = fit_baselines(increments, np.stack([stencil(s, exp.stencil) for s in states]), states,
                                      exp, coupling, cfg)

    learnt = _through_link(replace(coupling, explore=False), learner.export(), exp.stencil)
    learner.close()
    lead_steps = int(round(exp.lead_time / cfg.model_dt))
    reference, _ = L.truth_trajectory(x0[n_train:], y0[n_train:], cfg, lead_steps)
    corrections = {"native": lambda x: None, "bias_corrected": lambda x: np.full_like(x, bias), **fitted,
                   "corrected": learnt}
    rmse = {}
    for variant, correct in corrections.items():
        x, errors = reference[0].copy(), [0.0]
        for t in range(lead_steps):
            x = L.model_step(x, cfg, correction=correct(x))
            errors.append(float(np.sqrt(np.mean((x - reference[t + 1]) ** 2))))
        rmse[variant] = errors
    lead = (np.arange(lead_steps + 1) * cfg.model_dt).tolist()
    result = {"lead_time": lead, "rmse": rmse, "bias_correction": bias, "updates": learner.updates,
              "column_steps": learner.size, "train_s": train_s, "experiment": asdict(exp),
              "discount": 0.0, "baselines": baselines}
    out.mkdir(parents=True, exist_ok=True)
    (out / "l96_results.json").write_text(json.dumps(result) + "\n")
    return result
