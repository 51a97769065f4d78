import numpy as np
import pytest

from embodyrl.envs.columns import DAY_S, ColumnConfig, ColumnModel, row_split

SMALL = {"nlat": 8, "nlon": 16}


@pytest.fixture(scope="module")
def truth_state():
    model = ColumnModel(ColumnConfig.truth(**SMALL), seed=0)
    return model, model.initial_state(spin_up_days=3)


def test_full_size_grid_has_the_required_shape():
    cfg = ColumnConfig.truth()
    model = ColumnModel(cfg)
    assert (cfg.nlat, cfg.nlon, cfg.levels) == (32, 64, 70)
    theta = model.equilibrium(0.0)
    assert theta.shape == (64 * 32, 70)


def test_convective_adjustment_conserves_heat_and_leaves_a_stable_column(truth_state):
    model, theta = truth_state
    noisy = theta + np.random.default_rng(0).normal(size=theta.shape) * 5
    adjusted = model.convect(noisy)
    g = model.grid
    np.testing.assert_allclose(g.heat_content(adjusted), g.heat_content(noisy), rtol=1e-12)
    assert (np.diff(adjusted, axis=1) >= -1e-9).all()
    stable = np.sort(noisy, axis=1)  # already stable: untouched
    np.testing.assert_allclose(model.convect(stable), stable, rtol=1e-14)


def test_stochastic_weather_has_the_intended_statistics():
    cfg = ColumnConfig.truth(**SMALL)
    model = ColumnModel(cfg, seed=1)
    samples = []
    for _ in range(3000):
        model._advance_weather()
        samples.append(model.weather[:, 35].copy())  # mid-troposphere, where the heating peaks
    x = np.array(samples[500:])
    shape = model._level_shape[0, 35]
    assert x.std() == pytest.approx(cfg.weather_std * shape, rel=0.15)
    lag1 = np.mean([np.corrcoef(x[:-1, c], x[1:, c])[0, 1] for c in range(x.shape[1])])
    assert lag1 == pytest.approx(np.exp(-cfg.dt_s / (cfg.weather_memory_days * DAY_S)), abs=0.03)


def test_diagnostics_are_physical(truth_state):
    model, theta = truth_state
    g = model.grid
    z500 = g.band_means(g.z500(theta))
    t850 = g.band_means(g.t850(theta))
    assert ((z500 > 4500) & (z500 < 6200)).all() and z500[2] > z500[0]  # tropics higher than poles
    assert ((t850 > 220) & (t850 < 310)).all()


def test_truth_and_model_differ_and_nudging_pulls_the_model_to_the_analysis(truth_state):
    truth, theta0 = truth_state
    steps = int(2 * DAY_S / truth.cfg.dt_s)
    analysis = [theta0]
    for _ in range(steps):
        analysis.append(truth.step(analysis[-1])[0])
    g = truth.grid

    def run(nudge: bool):
        model = ColumnModel(ColumnConfig.model(**SMALL), seed=99)
        model.time_s = truth.time_s - steps * truth.cfg.dt_s
        x = theta0.copy()
        for t in range(steps):
            x, _ = model.step(x, nudge_to=analysis[t] if nudge else None)
        return np.mean(np.abs(g.z500(x) - g.z500(analysis[-1])))

    free, nudged = run(False), run(True)
    assert free > 5.0  # metres of Z500 error after two days: the model is wrong
    assert nudged < 0.5 * free


def test_row_split_covers_the_grid_with_unequal_blocks():
    blocks = row_split(32, 4)
    assert [r.start for r in blocks[1:]] == [r.stop for r in blocks[:-1]]
    assert blocks[0].start == 0 and blocks[-1].stop == 32
    sizes = [len(r) for r in blocks]
    assert len(set(sizes)) > 1 and sizes[0] > sizes[1]  # polar blocks hold more rows
    assert [len(r) for r in row_split(5, 5)] == [1] * 5
    with pytest.raises(ValueError, match="cannot split"):
        row_split(4, 5)


def test_blocks_stepped_with_halos_reproduce_the_serial_grid(truth_state):
    full, theta0 = truth_state
    cfg = full.cfg
    serial = ColumnModel(cfg, seed=7)
    blocks = [ColumnModel(cfg, seed=7, rows=r) for r in row_split(cfg.nlat, 3)]
    for m in [serial, *blocks]:
        m.time_s = 5 * DAY_S
    x = theta0.copy()
    parts = [theta0[m.columns].copy() for m in blocks]
    rng = np.random.default_rng(3)
    for _ in range(6):
        correction = rng.normal(size=x.shape) * 1e-5
        x, _ = serial.step(x, correction)
        # each block's state after its tendency update, edge rows passed as MPI would
        updated = [m.tendency_update(p, correction[m.columns]) for m, p in zip(blocks, parts, strict=True)]
        parts = [m.step(p, correction[m.columns], halos=_halos(updated, i, cfg.nlon))[0]
                 for i, (m, p) in enumerate(zip(blocks, parts, strict=True))]
    np.testing.assert_allclose(np.concatenate(parts), x, rtol=0, atol=1e-9)


def _halos(updated, i, nlon):
    return lambda theta: (None if i == 0 else updated[i - 1][-nlon:],
                          None if i == len(updated) - 1 else updated[i + 1][:nlon])


def test_block_diagnostics_add_up_to_the_grid_means(truth_state):
    model, theta = truth_state
    g = model.grid
    z = g.z500(theta)
    total_v, total_w = np.zeros(6), np.zeros(6)
    for rows in row_split(model.cfg.nlat, 3):
        block = ColumnModel(model.cfg, rows=rows)
        v, w = block.band_sums(z[block.columns])
        total_v, total_w = total_v + v, total_w + w
    np.testing.assert_allclose(total_v / total_w, g.band_means(z), rtol=1e-12)
    t = g.temperature(theta)
    np.testing.assert_allclose(g.t850(theta), [np.interp(-850.0, -g.p, row) for row in t], rtol=1e-12)


def test_features_and_context_are_finite_and_of_order_one(truth_state):
    model, theta = truth_state
    f, c = model.features(theta), model.context(theta)
    assert f.shape == (*theta.shape, ColumnModel.FEATURES) and f.dtype == np.float32
    assert c.shape == (theta.shape[0], ColumnModel.CONTEXT)
    assert np.isfinite(f).all() and np.abs(f).max() < 10 and np.abs(c).max() <= 1


@pytest.fixture(scope="module")
def moist_state():
    """The moist testbed's truth after 6 days from equilibrium (convection has organised)."""
    model = ColumnModel(ColumnConfig.moist_truth(**SMALL), seed=0)
    return model, model.initial_state(spin_up_days=6)


def test_a_lifted_parcel_is_dry_below_its_condensation_level_and_keeps_its_theta_e_above():
    from embodyrl.envs.columns import LATENT_OVER_CP, lifted_parcel, saturation_humidity

    g = ColumnModel(ColumnConfig.moist_truth(**SMALL)).grid
    theta0, q = np.array([300.0, 300.0, 280.0]), np.array([0.018, 0.010, 0.004])
    T, saturated = lifted_parcel(theta0, q, g.p, g.exner)
    dry = theta0[:, None] * g.exner
    np.testing.assert_allclose(T[~saturated], dry[~saturated])  # dry adiabat: theta kept
    qs = saturation_humidity(T, g.p)
    assert (qs[~saturated] >= 0.95 * q[:, None].repeat(g.p.size, 1)[~saturated]).all()  # unsaturated there
    theta_e = T / g.exner * np.exp(LATENT_OVER_CP * qs / T)
    want = theta0 * np.exp(LATENT_OVER_CP * q / (theta0 * g.exner[0]))
    np.testing.assert_allclose(theta_e[saturated], np.broadcast_to(want[:, None], T.shape)[saturated], rtol=1e-6)
    lcl = saturated.argmax(axis=1)
    assert lcl[0] < lcl[1] and saturated[:2].any(axis=1).all()  # moister air condenses lower


def test_moist_convection_heats_above_the_cloud_base_and_cools_below_where_moist_and_unstable(moist_state):
    model, theta = moist_state
    heating = model.convective_heating(theta, model.time_s) * DAY_S
    humidity = model.surface_humidity(theta, model.time_s)
    convecting = np.abs(heating).max(axis=1) > 0
    assert 0.1 < convecting.mean() < 0.9  # some columns, not all
    assert (humidity[convecting] >= model.cfg.moisture_threshold).all()
    assert np.abs(model.col_lat[convecting]).mean() < np.abs(model.col_lat[~convecting]).mean()  # tropics
    assert (heating[:, 0] == 0).all() and heating.max() > 1.0 and heating.min() < 0
    cooled = heating < 0
    np.testing.assert_allclose(heating[cooled] * model.grid.exner[np.nonzero(cooled)[1]],
                               -model.cfg.subcloud_cooling)  # the sub-cloud layer's cooling, in T
    first_heated = np.where((heating > 0).any(axis=1), (heating > 0).argmax(axis=1), 99)
    last_cooled = np.where(cooled.any(axis=1), model.grid.p.size - 1 - cooled[:, ::-1].argmax(axis=1), -1)
    assert (last_cooled < first_heated).all()  # cooled below, heated above
    dry = ColumnModel(ColumnConfig.moist_model(**SMALL))  # the model: the truth less this process alone
    assert dry.cfg == ColumnConfig(**{**vars(model.cfg), "moist_convection": False})
    dry.weather = model.weather
    np.testing.assert_allclose(dry.tendency(theta, model.time_s),
                               model.tendency(theta, model.time_s) - heating / DAY_S, rtol=1e-12, atol=1e-15)


def test_the_moist_truth_stays_physical_for_a_month_and_its_context_carries_the_surface_air(moist_state):
    model, theta = moist_state
    for _ in range(int(24 * DAY_S / model.cfg.dt_s)):
        theta, _ = model.step(theta)
    assert np.isfinite(theta).all() and theta.min() > 180 and theta.max() < 700
    assert (np.diff(theta, axis=1) >= -1e-6).all()  # dry-stable after each step's adjustment
    c = model.context(theta)
    assert c.shape == (theta.shape[0], model.cfg.context_size) == (theta.shape[0], ColumnModel.CONTEXT + 1)
    np.testing.assert_allclose(c[:, -1], (theta[:, 0] - 300.0) / 50.0, rtol=1e-6)
    with pytest.raises(ValueError, match="pass theta"):
        model.context()
