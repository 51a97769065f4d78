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
thread of this process. Evaluation: forecasts from truth states not used in
training, RMSE against the truth versus lead time, for the native model,
the constant bias correction (the mean nudging increment) and the frozen
learnt policy. :func:`run` writes ``DIR/l96_results.json``.
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
    seed: int = 0

    @classmethod
    def quick(cls) -> L96Experiment:
        return cls(train_forecasts=4, train_time=1.0, eval_forecasts=4, lead_time=0.5, updates=200)

    def coupling(self) -> CouplingConfig:
        return CouplingConfig(levels=1, features=2 * self.stencil + 1, context=0, radius=0,
                              max_correction=self.max_correction, stream_fraction=self.stream_fraction)


def stencil(x: np.ndarray, width: int) -> np.ndarray:
    """[forecasts * K, 1 level, 2 width + 1]: each site's periodic neighbourhood, scaled by 1/10."""
    shifts = [np.roll(x, -s, axis=-1) for s in range(-width, width + 1)]
    return (np.stack(shifts, axis=-1) / 10.0).reshape(-1, 1, 2 * width + 1)


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
        ddpg=replace(CouplingLearnerConfig().ddpg, batch_size=256), min_steps=1000, seed=exp.seed))
    done = threading.Event()
    thread = threading.Thread(target=learner.run, args=(3600.0, lambda: done.is_set()
                                                        and learner.updates >= exp.updates), daemon=True)
    learner.warm_up()
    thread.start()
    link = CouplingLink(replace(coupling, learner=learner.endpoint, connect_timeout_s=60.0, peer_timeout_s=60.0),
                        rank=0, policy=NumpyPolicy(*learner.export(), seed=exp.seed), seed=exp.seed)
    x, increments = truth[0].copy(), []
    t0 = time.perf_counter()
    for t in range(train_steps):
        nudge = (truth[t] - x) / exp.nudge_tau
        link.exchange(stencil(x, exp.stencil), {"target": nudge.reshape(-1, 1)})
        increments.append(nudge.mean())
        x = L.model_step(x, cfg, correction=nudge)
    link.close(flush_s=30.0)
    done.set()
    thread.join(timeout=1800)
    train_s = time.perf_counter() - t0
    bias = float(np.mean(increments))  # every site alike by symmetry: one constant

    frozen = CouplingLink(replace(coupling, explore=False), rank=0, policy=NumpyPolicy(*learner.export()))
    learner.close()
    lead_steps = int(round(exp.lead_time / cfg.model_dt))
    reference, _ = L.truth_trajectory(x0[n_train:], y0[n_train:], cfg, lead_steps)
    rmse = {}
    for variant in ("native", "bias_corrected", "corrected"):
        x, errors = reference[0].copy(), [0.0]
        for t in range(lead_steps):
            correction = None
            if variant == "bias_corrected":
                correction = np.full_like(x, bias)
            elif variant == "corrected":
                correction = frozen.exchange(stencil(x, exp.stencil)).reshape(x.shape)
            x = L.model_step(x, cfg, correction=correction)
            errors.append(float(np.sqrt(np.mean((x - reference[t + 1]) ** 2))))
        rmse[variant] = errors
    lead = (np.arange(lead_steps + 1) * cfg.model_dt).tolist()
    result = {"lead_time": lead, "rmse": rmse, "bias_correction": bias, "updates": learner.updates,
              "column_steps": learner.size, "train_s": train_s, "experiment": asdict(exp),
              "discount": 0.0}
    out.mkdir(parents=True, exist_ok=True)
    (out / "l96_results.json").write_text(json.dumps(result) + "\n")
    return result
