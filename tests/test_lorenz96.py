import json

import numpy as np
import pytest

from embodyrl.envs import lorenz96 as L

CFG = L.L96Config()


def test_rk4_is_fourth_order_on_the_slow_system():
    x0 = np.random.default_rng(0).normal(size=(1, 8)) * 3

    def integrate(dt, steps):
        x = x0
        for _ in range(steps):
            x = L.rk4(lambda s: (L.slow_tendency(s[0], 20.0),), (x,), dt)[0]
        return x

    reference = integrate(1e-4, 1000)
    e1 = np.abs(integrate(0.004, 25) - reference).max()
    e2 = np.abs(integrate(0.002, 50) - reference).max()
    assert 10 < e1 / e2 < 22  # 2^4 = 16


def test_truth_stays_on_a_bounded_chaotic_attractor_and_the_model_drifts_from_it():
    rng = np.random.default_rng(1)
    x, y = L.spin_up(CFG, rng, n=3, time=2.0)
    traj, _ = L.truth_trajectory(x, y, CFG, 100)
    assert np.isfinite(traj).all() and np.abs(traj).max() < 40 and traj.std() > 2
    model = x.copy()
    errors = []
    for t in range(100):
        model = L.model_step(model, CFG)
        errors.append(np.sqrt(np.mean((model - traj[t + 1]) ** 2)))
    assert errors[0] < 0.2 and errors[-1] > 5 * errors[0]  # the missing scales make it diverge


def test_a_correction_tendency_enters_the_model():
    x = np.ones((1, 8))
    np.testing.assert_allclose(L.model_step(x, CFG, correction=np.full((1, 8), 2.0)) - L.model_step(x, CFG),
                               2.0 * CFG.model_dt, rtol=0.05)  # plus O(dt^2) interaction


def test_the_coupling_stencil_is_periodic_and_site_major():
    from embodyrl.coupling.lorenz96 import stencil

    x = np.arange(16, dtype=float).reshape(2, 8)
    s = stencil(x, 2)
    assert s.shape == (16, 1, 5)
    np.testing.assert_allclose(s[0, 0] * 10, [6, 7, 0, 1, 2])  # forecast 0, site 0: X_{-2..2}
    np.testing.assert_allclose(s[15, 0] * 10, [13, 14, 15, 8, 9])  # forecast 1, site 7


@pytest.mark.slow
def test_the_learnt_correction_beats_the_one_scale_model_at_short_leads(tmp_path):
    import runpy
    from pathlib import Path

    example = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "lorenz96_correction.py"))
    assert example["main"](["--out", str(tmp_path), "--quick"]) == 0
    res = json.loads((tmp_path / "l96_results.json").read_text())
    i = 50  # lead 0.25 (steps of 0.005)
    assert res["rmse"]["corrected"][i] < 0.7 * res["rmse"]["native"][i]
    assert (tmp_path / "coupling_l96.png").exists()
