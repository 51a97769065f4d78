"""The two-scale Lorenz-96 system (Lorenz 1996) and its one-scale "model".

Truth: K slow variables X_k, each coupled to J fast variables Y_{j,k}::

    dX_k/dt     = -X_{k-1} (X_{k-2} - X_{k+1}) - X_k + F - (h c / b) sum_j Y_{j,k}
    dY_{j,k}/dt = -c b Y_{j+1,k} (Y_{j+2,k} - Y_{j-1,k}) - c Y_{j,k} + (h c / b) X_k

with K=8, J=32, h=1, b=c=10, F=20, integrated with RK4 at dt=0.001. The
model is the X equation alone (the fast scales missing) with RK4 at
dt=0.005: a forecast model with a real, state-dependent error that a learnt
correction can reduce. Arrays are ``[..., K]`` (and ``[..., J*K]`` for Y),
so many forecasts step at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class L96Config:
    K: int = 8
    J: int = 32
    h: float = 1.0
    b: float = 10.0
    c: float = 10.0
    F: float = 20.0
    truth_dt: float = 0.001
    model_dt: float = 0.005


def slow_tendency(x: np.ndarray, F: float) -> np.ndarray:
    return -np.roll(x, 1, -1) * (np.roll(x, 2, -1) - np.roll(x, -1, -1)) - x + F


def truth_tendency(x: np.ndarray, y: np.ndarray, cfg: L96Config) -> tuple[np.ndarray, np.ndarray]:
    coupling = cfg.h * cfg.c / cfg.b
    y_sum = y.reshape(*y.shape[:-1], cfg.K, cfg.J).sum(-1)
    dx = slow_tendency(x, cfg.F) - coupling * y_sum
    dy = (-cfg.c * cfg.b * np.roll(y, -1, -1) * (np.roll(y, -2, -1) - np.roll(y, 1, -1))
          - cfg.c * y + coupling * np.repeat(x, cfg.J, axis=-1))
    return dx, dy


def rk4(f, state, dt):
    k1 = f(state)
    k2 = f(tuple(s + 0.5 * dt * k for s, k in zip(state, k1, strict=True)))
    k3 = f(tuple(s + 0.5 * dt * k for s, k in zip(state, k2, strict=True)))
    k4 = f(tuple(s + dt * k for s, k in zip(state, k3, strict=True)))
    return tuple(s + dt / 6 * (a + 2 * b + 2 * c + d) for s, a, b, c, d in zip(state, k1, k2, k3, k4, strict=True))


def truth_step(x, y, cfg: L96Config, steps: int = 1):
    for _ in range(steps):
        x, y = rk4(lambda s: truth_tendency(s[0], s[1], cfg), (x, y), cfg.truth_dt)
    return x, y


def model_step(x, cfg: L96Config, correction: np.ndarray | None = None):
    """One model step of ``model_dt``; ``correction`` is an added tendency (held over the step)."""
    def f(s):
        dx = slow_tendency(s[0], cfg.F)
        return (dx if correction is None else dx + correction,)

    return rk4(f, (x,), cfg.model_dt)[0]


def spin_up(cfg: L96Config, rng: np.random.Generator, n: int = 1, time: float = 10.0):
    """``n`` truth states on the attractor."""
    x = cfg.F * 0.1 * rng.normal(size=(n, cfg.K)) + 1.0
    y = 0.1 * rng.normal(size=(n, cfg.K * cfg.J))
    return truth_step(x, y, cfg, int(time / cfg.truth_dt))


def truth_trajectory(x, y, cfg: L96Config, model_steps: int):
    """Truth X sampled every ``model_dt``: [model_steps + 1, ..., K]."""
    ratio = round(cfg.model_dt / cfg.truth_dt)
    out = [x]
    for _ in range(model_steps):
        x, y = truth_step(x, y, cfg, ratio)
        out.append(x)
    return np.stack(out), y
