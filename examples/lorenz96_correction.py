"""Lorenz-96: forecast RMSE with and without a correction learnt through the coupling link.

::

    python examples/lorenz96_correction.py --out runs/l96          # --quick: a smaller run

Runs :func:`embodyrl.coupling.lorenz96.run` (nudged training with the
coupling learner in a thread, then forecasts of the one-scale model, the
constant bias correction and the frozen learnt policy), then writes
``DIR/l96_results.json`` and ``DIR/coupling_l96.png``, with the offline baselines
(ridge, a polynomial, Wilks's quartic with and without AR(1) noise, an MLP) and the gap check.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from embodyrl.coupling.lorenz96 import L96Experiment, run

LABELS = {"native": "one-scale model", "bias_corrected": "constant bias correction", "ridge": "ridge (offline)",
          "polynomial": "polynomial, degree 2 (offline)", "wilks": "Wilks quartic of X_k (offline)",
          "wilks_ar1": "Wilks quartic + AR(1) noise", "mlp": "MLP (offline)", "corrected": "learnt correction (DDPG)"}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key, values in result["rmse"].items():
        ax.plot(result["lead_time"], values, label=LABELS.get(key, key),
                linestyle="--" if key in ("ridge", "polynomial", "wilks", "wilks_ar1", "mlp") else "-")
    ax.set_xlabel("lead time (model time units)")
    ax.set_ylabel("forecast RMSE of X")
    ax.set_title("Lorenz-96 (K=8, J=32, F=20)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Lorenz-96: forecast RMSE with and without a learnt correction")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    result = run(L96Experiment.quick() if args.quick else L96Experiment(), args.out)
    plot(result, args.out / "coupling_l96.png")
    b = result["baselines"]
    print(f"held-out increment R2: ridge {b['ridge_r2_heldout']:.3f} polynomial {b['polynomial_r2_heldout']:.3f} "
          f"wilks {b['wilks_r2_heldout']:.3f} mlp {b['mlp_r2_heldout']:.3f}; gap ratio {b['gap']['ratio']:.3f} "
          f"(needed {b['gap']['needed']}, met {b['gap']['met']})")
    for i in np.linspace(0, len(result["lead_time"]) - 1, 6).astype(int):
        print(f"lead {result['lead_time'][i]:.2f}: " + "  ".join(f"{k} {v[i]:.3f}" for k, v in result["rmse"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
