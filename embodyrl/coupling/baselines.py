"""Offline baselines for a learnt column correction: a ridge regression and an MLP fitted to the
nudging increments recorded in the nudged training period, on the policy's own inputs.

Both read what the online policy reads (one level's window,
:func:`~embodyrl.hal.coupling.link.level_inputs`: the features at levels
k-r..k+r and the column's context) and predict that level's increment, so
they are the regressions a reviewer asks for first: DDPG at discount 0,
scored against the increment, is regression by policy gradient. Both export
to the numpy runtime like the learner's policy, so the same link runs them.

* **ridge**: ``increment ~ w . window + b``, one weight vector shared by every
  level (like the policy), closed form; the runtime clips its output to the
  correction bound as it clips every policy. Its penalty, on the inputs' own
  units, is chosen on a later period than the one it is fitted on
  (:func:`fit_ridge_validated`).
* **polynomial**: the same with every product of two inputs added (degree 2),
  exported with the runtime's ``products`` op.
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
from ..hal.runtime import with_products
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


def windows(data: Increments, coupling: CouplingConfig, degree: int = 1) -> np.ndarray:
    """[n * L, window] float32: every level's input window (``degree`` 2: with every product of two of
    its inputs appended, :func:`~embodyrl.hal.runtime.with_products`)."""
    x = level_inputs(data.profile, data.context, coupling.radius).reshape(-1, coupling.window)
    return with_products(x) if degree == 2 else x


def _normal_equations(data: Increments, coupling: CouplingConfig, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """(X'X, X'y) of the level rows with an intercept column, accumulated in chunks (the level rows of a
    full run, with products, do not fit in memory at once)."""
    gram, cross = None, None
    chunk = 4096 if degree == 1 else 256
    for lo in range(0, len(data), chunk):
        part = data.where(slice(lo, lo + chunk))
        x = windows(part, coupling, degree).astype(np.float64)
        x = np.concatenate([x, np.ones((len(x), 1))], 1)
        y = part.increment.reshape(-1).astype(np.float64)
        gram, cross = (x.T @ x, x.T @ y) if gram is None else (gram + x.T @ x, cross + x.T @ y)
    return gram, cross


def _solve(gram: np.ndarray, cross: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    penalty = np.full(len(gram), l2 * gram[-1, -1])  # gram[-1, -1]: the rows
    penalty[-1] = 0.0  # no penalty on the intercept
    coef = np.linalg.solve(gram + np.diag(penalty), cross)
    return coef[:-1].astype(np.float32), float(coef[-1])


def fit_ridge(data: Increments, coupling: CouplingConfig, l2: float = 1e-3, degree: int = 1) -> tuple[np.ndarray, float]:
    """(w [inputs], b): ridge regression of the increment on the window (``degree`` 2: a polynomial of
    degree 2 of it, every product of two inputs). The penalty ``l2 * rows * |w|^2`` is on the inputs'
    own units, which the model scales to order one: standardising them would free the weights of inputs
    that barely vary in a few weeks (the season's sine and cosine), whose large values then extrapolate
    badly to later dates."""
    return _solve(*_normal_equations(data, coupling, degree), l2)


RIDGE_PENALTIES = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def fit_ridge_validated(fit: Increments, held: Increments, coupling: CouplingConfig,
                        penalties=RIDGE_PENALTIES, degree: int = 1) -> tuple[np.ndarray, float, dict]:
    """Ridge (or with ``degree`` 2 the polynomial) with the penalty that scores best on ``held`` (a later
    period) when fitted on ``fit``, then refitted on both (their normal equations summed):
    (w, b, {"l2", "r2_heldout", "r2_by_l2"})."""
    gram, cross = _normal_equations(fit, coupling, degree)
    scores = {}
    for l2 in penalties:
        w, b = _solve(gram, cross, l2)
        scores[l2] = r2(ridge_predict(held, coupling, w, b, degree), held.increment)
    best = max(scores, key=scores.get)
    held_gram, held_cross = _normal_equations(held, coupling, degree)
    w, b = _solve(gram + held_gram, cross + held_cross, best)
    return w, b, {"l2": best, "r2_heldout": scores[best], "r2_by_l2": {str(k): v for k, v in scores.items()}}


def ridge_policy(coupling: CouplingConfig, w: np.ndarray, b: float, version: PolicyVersion,
                 degree: int = 1) -> tuple[dict, dict[str, np.ndarray]]:
    """The ridge regression (``degree`` 2: the polynomial) as a numpy-runtime export: one dense op, after
    the ``products`` op for the polynomial; the runtime clips to the bound."""
    name = "ridge" if degree == 1 else "polynomial"
    graph = [{"op": "concat", "fields": ["window"]}, *([{"op": "products"}] if degree == 2 else []),
             {"op": "dense", "kernel": f"{name}/kernel", "bias": f"{name}/bias"}]
    return finish(name, version, coupling.level_observation_spec(), coupling.level_action_spec(),
                  {"kind": "gaussian", "std": 0.0}, graph,
                  {f"{name}/kernel": np.asarray(w, np.float32)[:, None], f"{name}/bias": np.full(1, b, np.float32)})


def ridge_predict(data: Increments, coupling: CouplingConfig, w: np.ndarray, b: float,
                  degree: int = 1) -> np.ndarray:
    bound = coupling.max_correction
    out = [np.clip(windows(data.where(slice(lo, lo + 1024)), coupling, degree) @ w + b, -bound, bound)
           for lo in range(0, len(data), 1024)]
    return np.concatenate(out).reshape(data.increment.shape)


def fit_mlp(data: Increments, coupling: CouplingConfig, config: ddpg.DDPGConfig, seed: int, steps: int = 4000,
            batch_columns: int = 64, lr: float = 1e-3):
    """(networks, actor params): the online actor's network trained by regression on the increments
    (clipped to the bound, as the policy's output is)."""
    networks, state = init(jax.random.key(seed), coupling, config)
    bound = coupling.max_correction
    target = np.clip(data.increment, -bound, bound).astype(np.float32)
    optimiser = optax.adam(optax.cosine_decay_schedule(lr, steps))  # the last steps settle, not wander

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


GAP_RATIO = 1.3
"""How much more held-out increment variance the offline MLP must explain than the best offline fit
(ridge or the polynomial) for a testbed to need a learnt nonlinear correction."""


def gap_check(mlp_r2: float, fits: dict[str, float]) -> dict:
    """Whether an MLP on the policy's inputs explains at least :data:`GAP_RATIO` times the held-out
    variance of the best offline fit (``fits``: name -> held-out R2, e.g. ridge and the polynomial): a
    testbed where it does not is no test of a learnt correction."""
    name = max(fits, key=fits.get)
    best = fits[name]
    ratio = mlp_r2 / best if best > 0 else float("inf")
    return {"mlp_r2": mlp_r2, "best_fit": name, "best_fit_r2": best, "ratio": ratio, "needed": GAP_RATIO,
            "met": bool(ratio >= GAP_RATIO)}
