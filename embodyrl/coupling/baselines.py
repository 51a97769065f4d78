"""Offline baselines for a learnt column correction: a ridge regression and an MLP fitted to the
nudging increments recorded in the nudged training period, on the policy's own inputs.

Both read what the online policy reads (one level's window,
:func:`~embodyrl.hal.coupling.link.level_inputs`: the features at levels
k-r..k+r and the column's context) and predict that level's increment, so
they are the regressions a reviewer asks for first: DDPG at discount 0,
scored against the increment, is regression by policy gradient. Both export
to the numpy runtime like the learner's policy, so the same link runs them.

* **ridge**: ``increment ~ w . window + b``, one weight vector shared by every
  level (like the policy), closed form on standardised inputs; the runtime
  clips its output to the correction bound as it clips every policy. Its
  penalty, on the inputs' own units, is chosen on a later period than the
  one it is fitted on (:func:`fit_ridge_validated`).
* **mlp**: the online actor's network (the MLP, tanh, the bound) trained by
  Adam on the squared error to the increment clipped to the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..algos import ddpg
from ..algos.runtime_graph import finish
from ..hal.coupling.link import CouplingConfig, level_inputs
from ..hal.steps import PolicyVersion
from .learner import export_policy, init


@dataclass(frozen=True)
class Increments:
    """Recorded nudged steps: profile [n, L, F], context [n, C], increment [n, L] (K/day), start [n]."""

    profile: np.ndarray
    context: np.ndarray
    increment: np.ndarray
    start: np.ndarray

    @classmethod
    def load(cls, paths) -> Increments:
        parts = [np.load(p, allow_pickle=False) for p in paths]
        return cls(*(np.concatenate([p[k] for p in parts]) for k in ("profile", "context", "increment", "start")))

    def where(self, mask: np.ndarray) -> Increments:
        return Increments(self.profile[mask], self.context[mask], self.increment[mask], self.start[mask])

    def __len__(self) -> int:
        return len(self.increment)


def windows(data: Increments, coupling: CouplingConfig) -> np.ndarray:
    """[n * L, window] float32: every level's input window."""
    return level_inputs(data.profile, data.context, coupling.radius).reshape(-1, coupling.window)


def fit_ridge(data: Increments, coupling: CouplingConfig, l2: float = 1e-3) -> tuple[np.ndarray, float]:
    """(w [window], b): ridge regression of the increment on the window, accumulated in chunks (the level
    rows of a full run do not fit in memory twice). The penalty ``l2 * rows * |w|^2`` is on the inputs'
    own units, which the model scales to order one: standardising them would free the weights of inputs
    that barely vary in a few weeks (the season's sine and cosine), whose large values then extrapolate
    badly to later dates."""
    width = coupling.window
    gram, cross = np.zeros((width + 1, width + 1)), np.zeros(width + 1)
    for lo in range(0, len(data), 4096):
        part = data.where(slice(lo, lo + 4096))
        x = np.concatenate([windows(part, coupling), np.ones((len(part) * coupling.levels, 1), np.float32)], 1)
        x = x.astype(np.float64)
        gram += x.T @ x
        cross += x.T @ part.increment.reshape(-1).astype(np.float64)
    penalty = np.full(width + 1, l2 * gram[-1, -1])
    penalty[-1] = 0.0  # no penalty on the intercept
    coef = np.linalg.solve(gram + np.diag(penalty), cross)
    return coef[:-1].astype(np.float32), float(coef[-1])


RIDGE_PENALTIES = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def fit_ridge_validated(fit: Increments, held: Increments, everything: Increments, coupling: CouplingConfig,
                        penalties=RIDGE_PENALTIES) -> tuple[np.ndarray, float, dict]:
    """Ridge with the penalty that scores best on ``held`` (a later period) when fitted on ``fit``,
    then refitted on ``everything``: (w, b, {"l2", "r2_heldout", "r2_by_l2"})."""
    scores = {}
    for l2 in penalties:
        w, b = fit_ridge(fit, coupling, l2)
        scores[l2] = r2(ridge_predict(held, coupling, w, b), held.increment)
    best = max(scores, key=scores.get)
    w, b = fit_ridge(everything, coupling, best)
    return w, b, {"l2": best, "r2_heldout": scores[best], "r2_by_l2": {str(k): v for k, v in scores.items()}}


def ridge_policy(coupling: CouplingConfig, w: np.ndarray, b: float,
                 version: PolicyVersion) -> tuple[dict, dict[str, np.ndarray]]:
    """The ridge regression as a numpy-runtime export (one dense op; the runtime clips to the bound)."""
    graph = [{"op": "concat", "fields": ["window"]},
             {"op": "dense", "kernel": "ridge/kernel", "bias": "ridge/bias"}]
    return finish("ridge", version, coupling.level_observation_spec(), coupling.level_action_spec(),
                  {"kind": "gaussian", "std": 0.0}, graph,
                  {"ridge/kernel": np.asarray(w, np.float32)[:, None], "ridge/bias": np.full(1, b, np.float32)})


def ridge_predict(data: Increments, coupling: CouplingConfig, w: np.ndarray, b: float) -> np.ndarray:
    bound = coupling.max_correction
    return np.clip(windows(data, coupling) @ w + b, -bound, bound).reshape(data.increment.shape)


def fit_mlp(data: Increments, coupling: CouplingConfig, config: ddpg.DDPGConfig, seed: int, steps: int = 4000,
            batch_columns: int = 64, lr: float = 1e-3):
    """(networks, actor params): the online actor's network trained by regression on the increments
    (clipped to the bound, as the policy's output is)."""
    networks, state = init(jax.random.key(seed), coupling, config)
    bound = coupling.max_correction
    target = np.clip(data.increment, -bound, bound).astype(np.float32)
    optimiser = optax.adam(lr)

    def loss(params, profile, context, y):
        return jnp.mean((networks.policy(params, {"profile": profile, "context": context}) - y) ** 2)

    @jax.jit
    def update(params, opt_state, profile, context, y):
        grads = jax.grad(loss)(params, profile, context, y)
        updates, opt_state = optimiser.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    params, rng = state.actor_params, np.random.default_rng(seed)
    opt_state = optimiser.init(params)
    for _ in range(steps):
        idx = rng.integers(0, len(data), batch_columns)
        params, opt_state = update(params, opt_state, data.profile[idx], data.context[idx], target[idx])
    return networks, params


def mlp_predict(networks, params, data: Increments) -> np.ndarray:
    out = [np.asarray(networks.policy(params, {"profile": data.profile[lo:lo + 4096],
                                               "context": data.context[lo:lo + 4096]}))
           for lo in range(0, len(data), 4096)]
    return np.concatenate(out)


def mlp_policy(networks, params, config: ddpg.DDPGConfig,
               version: PolicyVersion) -> tuple[dict, dict[str, np.ndarray]]:
    return export_policy(networks, params, config, version)


def r2(prediction: np.ndarray, target: np.ndarray) -> float:
    """Fraction of the target's variance explained (1 - MSE / variance)."""
    return float(1.0 - np.mean((target - prediction) ** 2) / np.var(target))
