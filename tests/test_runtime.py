"""The numpy policy runtime: the exported DDPG actor equals the JAX one."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from embodyrl.algos import ddpg
from embodyrl.cli.export import export_ddpg, export_saved_policy
from embodyrl.hal import params as flat_params
from embodyrl.hal import runtime
from embodyrl.hal.policy import Policy
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import PolicyVersion
from embodyrl.policy import JaxPolicy, save_policy

OBS = DictSpec.of(ArraySpec("joints", (7,), np.float32), ArraySpec("grid", (2, 3), np.float64),
                  ArraySpec("camera/tiny", (4, 4, 3), np.uint8, 0, 255))
ACT = ArraySpec("action", (3,), np.float32, [-1.0, -3.0, 0.0], [1.0, 0.5, 10.0])


def _random_observations(rng, batch):
    return {"joints": rng.normal(size=(batch, 7)).astype(np.float32),
            "grid": rng.normal(size=(batch, 2, 3)),
            "camera/tiny": rng.integers(0, 256, size=(batch, 4, 4, 3), dtype=np.uint8) // 64}


def _random_actor(hidden, seed):
    networks, actor, _ = ddpg.make_networks(OBS, ACT, hidden, jax.random.key(seed))
    rng = np.random.default_rng(seed)
    # every parameter random (biases too), scaled by fan-in so tanh is not always saturated
    actor = jax.tree.map(lambda p: rng.normal(0, 1.5 / np.sqrt(p.shape[0]), p.shape).astype(np.float32), actor)
    return networks, actor


@pytest.mark.parametrize(("hidden", "seed"), [((16,), 0), ((32, 32), 1), ((64, 48, 32), 2), ((), 3)])
def test_numpy_mean_action_equals_the_jax_policy(hidden, seed):
    networks, actor = _random_actor(hidden, seed)
    config = ddpg.DDPGConfig(hidden_sizes=hidden)
    policy = runtime.NumpyPolicy(*export_ddpg(networks, actor, config))
    obs = _random_observations(np.random.default_rng(seed + 10), 64)
    expected = np.asarray(networks.policy(actor, obs))
    got = policy.mean_action(obs)
    assert got.shape == (64, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert (np.ptp(got, axis=0) > 1e-3).all()  # the observations matter: not a constant output


def test_export_round_trips_through_files_and_follows_published_weights(tmp_path):
    networks, actor = _random_actor((32, 32), 0)
    config = ddpg.DDPGConfig(hidden_sizes=(32, 32))
    json_path, npz_path = runtime.save(tmp_path / "policy", *export_ddpg(networks, actor, config))
    assert json.loads(json_path.read_text())["graph"][1]["op"] == "dense"
    policy = runtime.load(tmp_path / "policy", seed=0)
    assert isinstance(policy, Policy)
    obs = {k: v[0] for k, v in _random_observations(np.random.default_rng(5), 1).items()}
    np.testing.assert_allclose(policy.act(obs, explore=False)[0], networks.policy(actor, obs), rtol=1e-5, atol=1e-5)
    # the learner publishes flatten({"actor": params}); the runtime follows it
    _, newer = _random_actor((32, 32), 9)
    policy.load_weights(PolicyVersion(7, 3), flat_params.flatten({"actor": newer}))
    assert policy.version == PolicyVersion(7, 3)
    np.testing.assert_allclose(policy.act(obs, explore=False)[0], networks.policy(newer, obs), rtol=1e-5, atol=1e-5)


def test_exploration_noise_comes_from_the_runtimes_own_rng():
    networks, actor = _random_actor((16,), 0)
    graph, arrays = export_ddpg(networks, actor, ddpg.DDPGConfig(hidden_sizes=(16,), exploration_noise=0.3))
    obs = {k: v[0] for k, v in _random_observations(np.random.default_rng(1), 1).items()}
    a, b = runtime.NumpyPolicy(graph, arrays, seed=4), runtime.NumpyPolicy(graph, arrays, seed=4)
    noisy = np.array([a.act(obs, explore=True)[0] for _ in range(200)])
    np.testing.assert_array_equal(noisy[0], b.act(obs, explore=True)[0])  # seeded
    assert (noisy >= ACT.minimum).all() and (noisy <= ACT.maximum).all()
    mean = a.mean_action(obs)
    inside = (mean > ACT.minimum + 0.5) & (mean < ACT.maximum - 0.5)
    spread = noisy.std(axis=0) / ((ACT.maximum - ACT.minimum) / 2)
    np.testing.assert_allclose(spread[inside], 0.3, rtol=0.25)


def test_jax_policy_and_numpy_policy_act_alike(tmp_path):
    """The actor-side JaxPolicy, saved by the learner, exported, acts the same in numpy."""
    spec = DictSpec.of(ArraySpec("orientation", (2,), np.float32), ArraySpec("angular_velocity", (1,), np.float32))
    action = ArraySpec("action", (1,), np.float32, -2.0, 2.0)
    config = ddpg.DDPGConfig(hidden_sizes=(16, 16))
    jax_policy = JaxPolicy.for_specs(spec, action, config, seed=3)
    rng = np.random.default_rng(0)
    weights = flat_params.flatten({"actor": jax.tree.map(lambda p: rng.normal(0, 0.7, p.shape).astype(np.float32),
                                                         jax.device_get(jax_policy.params))})
    jax_policy.load_weights(PolicyVersion(1, 2), weights)
    save_policy(tmp_path / "run", PolicyVersion(1, 2), weights, spec, action, config)
    export_saved_policy(tmp_path / "run", tmp_path / "export" / "policy")
    numpy_policy = runtime.load(tmp_path / "export" / "policy")
    assert numpy_policy.version == PolicyVersion(1, 2)
    for _ in range(20):
        obs = {"orientation": rng.normal(size=2).astype(np.float32),
               "angular_velocity": rng.normal(size=1).astype(np.float32) * 3}
        np.testing.assert_allclose(numpy_policy.act(obs, explore=False)[0],
                                   jax_policy.act(obs, explore=False)[0], rtol=1e-5, atol=1e-5)


def test_malformed_exports_are_refused_with_the_name(tmp_path):
    networks, actor = _random_actor((8,), 0)
    graph, arrays = export_ddpg(networks, actor, ddpg.DDPGConfig(hidden_sizes=(8,)))
    with pytest.raises(runtime.ExportError, match="actor/layers/1/bias"):
        runtime.NumpyPolicy(graph, {k: v for k, v in arrays.items() if k != "actor/layers/1/bias"})
    bad = dict(arrays, **{"actor/layers/0/kernel": np.zeros((5, 8), np.float32)})
    with pytest.raises(runtime.ExportError, match="actor/layers/0/kernel"):
        runtime.NumpyPolicy(graph, bad)
    with pytest.raises(runtime.ExportError, match="softmax"):
        runtime.NumpyPolicy({**graph, "graph": [*graph["graph"], {"op": "softmax"}]}, arrays)
    policy = runtime.NumpyPolicy(graph, arrays)
    with pytest.raises(runtime.ExportError, match="actor/layers/0/bias"):
        policy.load_weights(PolicyVersion(1, 1), {"actor/layers/0/kernel": arrays["actor/layers/0/kernel"]})
    with pytest.raises(KeyError, match="joints"):
        policy.mean_action({"grid": np.zeros((2, 3))})


def test_runtime_imports_without_jax(tmp_path):
    networks, actor = _random_actor((8,), 0)
    runtime.save(tmp_path / "p", *export_ddpg(networks, actor, ddpg.DDPGConfig(hidden_sizes=(8,))))
    code = ("import sys; from embodyrl.hal import runtime; import numpy as np;"
            f"p = runtime.load({str(tmp_path / 'p')!r});"
            "obs = {s.name: s.zeros() for s in p.observation_spec.specs};"
            "print(p.act(obs, explore=False)[0].shape, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split()[-1] == "False"


def test_numpy_actor_example_runs_an_episode_without_jax(tmp_path):
    from pathlib import Path

    from embodyrl.envs import pendulum

    networks, actor, _ = ddpg.make_networks(pendulum.OBSERVATION_SPEC, pendulum.make_device().action_spec,
                                            (16,), jax.random.key(0))
    runtime.save(tmp_path / "p", *export_ddpg(networks, actor, ddpg.DDPGConfig(hidden_sizes=(16,))))
    example = Path(__file__).parents[1] / "examples" / "numpy_actor.py"
    out = subprocess.run([sys.executable, str(example), str(tmp_path / "p"), "--task", "pendulum",
                          "--episodes", "2", "--max-steps", "30"],
                         capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(report["returns"]) == 2 and all(r < 0 for r in report["returns"])
    assert report["jax_imported"] is False


@pytest.mark.parametrize("bounds", [{}, {"log_std_bounds": "clip", "log_std_min": -20.0},
                                    {"actor_layer_norm": True}])
def test_sac_export_matches_jax_and_samples_like_it(bounds):
    from embodyrl.algos import sac
    from embodyrl.cli.export import export_sac

    spec = DictSpec.of(ArraySpec("pos", (3,), np.float32), ArraySpec("vel", (2,), np.float32))
    action = ArraySpec("action", (2,), np.float32, [-2.0, 0.0], [2.0, 1.0])
    config = sac.SACConfig(hidden_sizes=(16, 16), **bounds)
    networks, state = sac.init(jax.random.key(5), spec, action, config)
    numpy_policy = runtime.NumpyPolicy(*export_sac(networks, state.actor_params, config, PolicyVersion(3, 4)), seed=0)
    rng = np.random.default_rng(1)
    obs = {"pos": rng.normal(size=(64, 3)).astype(np.float32), "vel": rng.normal(size=(64, 2)).astype(np.float32)}
    obs["pos"][:, 0] *= 255.0  # a field far from unit scale (a gripper command)
    np.testing.assert_allclose(numpy_policy.mean_action(obs), networks.mean_action(state.actor_params, obs),
                               rtol=1e-5, atol=1e-5)
    ops = [op["op"] for op in numpy_policy.ops]
    assert ops.count("layer_norm") == (len(config.hidden_sizes) if config.actor_layer_norm else 0)
    one = {k: v[0] for k, v in obs.items()}
    samples = np.array([numpy_policy.act(one, explore=True)[0] for _ in range(4000)])
    jax_samples = np.asarray(jax.vmap(lambda k: networks.sample(state.actor_params, one, k)[0])(
        jax.random.split(jax.random.key(0), 4000)))
    assert (samples >= action.minimum).all() and (samples <= action.maximum).all()
    np.testing.assert_allclose(samples.mean(0), jax_samples.mean(0), atol=0.05)
    np.testing.assert_allclose(samples.std(0), jax_samples.std(0), rtol=0.1, atol=0.01)


@pytest.mark.parametrize("shape,out,stride", [((1, 84, 84, 9), 16, 2), ((3, 2, 11, 9, 4), 5, 1), ((17, 17, 3), 7, 3)])
def test_runtime_convolution_equals_xla(shape, out, stride):
    """The numpy runtime's per-tap convolution is XLA's VALID convolution, leading axes included."""
    rng = np.random.default_rng(0)
    x = rng.random(shape, np.float32)
    kernel = rng.normal(size=(3, 3, shape[-1], out)).astype(np.float32)
    bias = rng.normal(size=out).astype(np.float32)
    flat = x.reshape(-1, *shape[-3:])
    expected = jax.lax.conv_general_dilated(flat, kernel, (stride, stride), "VALID",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC")) + bias
    got = runtime._conv2d(x, kernel, bias, stride)
    assert got.shape == (*shape[:-3], *expected.shape[1:]) and got.dtype == np.float32
    np.testing.assert_allclose(got.reshape(expected.shape), np.asarray(expected), rtol=1e-4, atol=1e-4)


def test_a_saved_td3_policy_exports_with_its_own_settings(tmp_path):
    """export_saved_policy reads the algorithm and its settings (here TD3's exploration noise) from policy.json."""
    from embodyrl.algos.registry import resolve

    algorithm = resolve("td3", ddpg.DDPGConfig(hidden_sizes=(8,), exploration_noise=0.3), None)
    networks, actor = algorithm.actor_networks(OBS, ACT, jax.random.key(0))
    save_policy(tmp_path / "policy", PolicyVersion(0, 2), flat_params.flatten({"actor": jax.device_get(actor)}),
                OBS, ACT, algorithm)
    json_path, _ = export_saved_policy(tmp_path / "policy", tmp_path / "export")
    assert json.loads(json_path.read_text())["exploration"] == {"kind": "gaussian", "std": 0.3}
    policy = runtime.load(tmp_path / "export")
    observation = _random_observations(np.random.default_rng(0), 4)
    np.testing.assert_allclose(policy.mean_action(observation),
                               networks.policy(actor, observation), rtol=1e-4, atol=1e-5)
