"""Heterogeneous devices: padded rows routed by device id through per-device heads and a shared trunk."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import ddpg, heads_sac, sac
from embodyrl.algos.encoders import EncoderConfig
from embodyrl.algos.heads import init, over
from embodyrl.algos.registry import resolve
from embodyrl.algos.sac.losses import make_losses
from embodyrl.hal.layout import DeviceKind, Layout
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.policy import JaxPolicy

PENDULUM = DeviceKind("pendulum", DictSpec.of(ArraySpec("orientation", (2,), np.float32),
                                              ArraySpec("angular_velocity", (1,), np.float32)),
                      ArraySpec("action", (1,), np.float32, -2.0, 2.0))
ARM = DeviceKind("arm", DictSpec.of(ArraySpec("qpos", (7,), np.float32), ArraySpec("target", (3,), np.float32)),
                 ArraySpec("action", (7,), np.float32, -5.0, 5.0))
LAYOUT = Layout((PENDULUM, ARM))
CONFIG = ddpg.td3(ddpg.DDPGConfig(hidden_sizes=(16, 16), batch_size=8))


def _batch(device_ids, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for d in device_ids:
        kind = LAYOUT.kinds[d]
        obs = {s.name: rng.normal(size=s.shape).astype(np.float32) for s in kind.observation_spec.specs}
        nxt = {s.name: rng.normal(size=s.shape).astype(np.float32) for s in kind.observation_spec.specs}
        act = rng.uniform(kind.action_spec.minimum, kind.action_spec.maximum).astype(np.float32)
        rows.append((LAYOUT.pad_observation(d, obs), LAYOUT.pad_observation(d, nxt), LAYOUT.pad_action(d, act)))
    stack = lambda xs: jax.tree.map(lambda *v: np.stack(v), *xs)  # noqa: E731
    n = len(device_ids)
    return {"observation": stack([r[0] for r in rows]), "next_observation": stack([r[1] for r in rows]),
            "action": np.stack([r[2] for r in rows]), "reward": rng.normal(size=n).astype(np.float32),
            "discount": np.full(n, 0.99, np.float32)}


def test_layout_pads_observations_and_actions_by_device():
    assert LAYOUT.observation_spec["features"].shape == (10,) and LAYOUT.action_spec.shape == (7,)
    padded = LAYOUT.pad_observation(0, {"orientation": np.array([0.5, -0.5], np.float32),
                                        "angular_velocity": np.array([3.0], np.float32)})
    np.testing.assert_array_equal(padded["features"], [3.0, 0.5, -0.5] + [0.0] * 7)  # spec order: sorted names
    assert padded["device"] == 0
    np.testing.assert_allclose(LAYOUT.pad_action(0, np.array([1.0], np.float32)), [0.5] + [0.0] * 6)
    np.testing.assert_allclose(LAYOUT.pad_action(1, np.full(7, -5.0, np.float32)), [-1.0] * 7)
    assert LAYOUT.refusal(1, "arm", ARM.observation_spec, ARM.action_spec) is None
    assert "differ from declared kind 'pendulum'" in LAYOUT.refusal(0, "arm", ARM.observation_spec, ARM.action_spec)
    assert "id 5" in LAYOUT.refusal(5, "x", ARM.observation_spec, ARM.action_spec)
    with pytest.raises(ValueError, match="off-policy .*, not ppo"):
        over(resolve("ppo", ddpg.DDPGConfig(), sac.SACConfig()), LAYOUT)
    with pytest.raises(ValueError, match="image_fields must be empty"):
        over(resolve("sac", ddpg.DDPGConfig(), sac.SACConfig(encoder=EncoderConfig(image_fields=("auto",)))),
               LAYOUT)


def test_actions_respect_each_devices_size_and_bounds():
    networks, state = init(jax.random.key(0), LAYOUT, CONFIG)
    batch = _batch([0, 1, 0, 1])
    action = networks.policy(state.actor_params, batch["observation"])
    assert action.shape == (4, 7)
    np.testing.assert_array_equal(action[0, 1:], 0.0)  # the pendulum row writes one dimension
    assert np.all(np.abs(action[1]) > 0) and np.all(np.abs(action) <= 1.0)
    assert networks.q_values(state.critic_params, batch["observation"], batch["action"]).shape == (2, 4)
    algo = over(resolve("td3", CONFIG, None), LAYOUT)
    for device_id, kind in enumerate(LAYOUT.kinds):
        policy = JaxPolicy(algo, LAYOUT, device_id)
        obs = {s.name: np.ones(s.shape, np.float32) for s in kind.observation_spec.specs}
        a, _ = policy.act(obs, explore=False)
        assert a.shape == kind.action_spec.shape
        assert np.all(a >= kind.action_spec.minimum) and np.all(a <= kind.action_spec.maximum)


def moved(before, after):
    return float(sum(jnp.sum(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after),
                                                              strict=True)))


def test_updating_on_device_a_leaves_device_b_heads_untouched_and_moves_the_shared_trunk():
    networks, state = init(jax.random.key(0), LAYOUT, CONFIG)
    update = jax.jit(ddpg.make_update(networks, CONFIG))
    new, metrics = update(state, _batch([0] * 8))  # pendulum rows only; step 0 moves the actor too
    assert np.isfinite(float(metrics["critic_loss"]))

    for params, new_params in ((state.actor_params, new.actor_params),
                               (state.critic_params, new.critic_params)):
        assert moved(params["inputs"][0], new_params["inputs"][0]) > 0  # device A's heads learn
        assert moved(params["outputs"][0], new_params["outputs"][0]) > 0
        assert moved(params["inputs"][1], new_params["inputs"][1]) == 0.0  # device B's do not move
        assert moved(params["outputs"][1], new_params["outputs"][1]) == 0.0
        assert moved(params["trunk"], new_params["trunk"]) > 0  # the trunk is shared
    # and the other way round: device B's rows move B's heads and leave A's
    other, _ = update(state, _batch([1] * 8, seed=3))
    assert moved(state.actor_params["inputs"][0], other.actor_params["inputs"][0]) == 0.0
    assert moved(state.actor_params["inputs"][1], other.actor_params["inputs"][1]) > 0


def test_example_trains_the_pendulum_and_the_arm_through_one_learner(tmp_path):
    """The example end to end: a learner, one spawned actor driving both robots, padded rows in replay."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from embodyrl.replay import PersistentReplay
    from tests.replay_helpers import stored_slots

    path = Path(__file__).parents[1] / "examples" / "heterogeneous_robots.py"
    done = subprocess.run([sys.executable, str(path), "--steps", "600", "--episodes", "1", "--run-dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    assert summary["env_steps"] >= 600 and summary["updates"] > 0
    for device in ("pendulum", "arm_reach"):
        assert all(np.isfinite(v) for v in summary["evaluation"][device].values())
    replay = PersistentReplay(tmp_path / "replay")
    rows = replay.store.rows[stored_slots(replay)]
    devices = rows["observation/device"]
    assert set(np.unique(devices).tolist()) == {0, 1}  # both robots streamed into the one replay
    pendulum, arm = rows[devices == 0], rows[devices == 1]
    np.testing.assert_array_equal(pendulum["observation/features"][:, 3:], 0.0)  # padding after 3 values
    np.testing.assert_array_equal(pendulum["action"][:, 1:], 0.0)
    assert np.abs(arm["observation/features"][:, 3:]).sum() > 0 and np.abs(arm["action"][:, 1:]).sum() > 0
    assert np.all(np.abs(rows["action"]) <= 1.0)  # unit actions, each device by its own bounds
    replay.close()


SAC_CONFIG = sac.SACConfig(hidden_sizes=(16, 16), batch_size=8)


def test_sac_samples_each_devices_own_dimensions_with_their_log_probability():
    networks, state = heads_sac.init(jax.random.key(0), LAYOUT, SAC_CONFIG)
    obs = _batch([0, 1, 0, 1, 1, 0])["observation"]
    action, logp = networks.sample(state.actor_params, obs, jax.random.key(1))
    assert action.shape == (6, 7) and logp.shape == (6,)
    for row, device in enumerate([0, 1, 0, 1, 1, 0]):
        m = LAYOUT.action_sizes[device]
        np.testing.assert_array_equal(action[row, m:], 0.0)  # padding is exactly zero
        assert np.all(np.abs(action[row, :m]) > 0)
    # the density of the squashed Gaussian over the row's own dimensions only
    mean, log_std = networks.distribution(state.actor_params, obs)
    u = jnp.arctanh(jnp.clip(action, -0.999999, 0.999999))
    per_dim = (-0.5 * ((u - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)
               - jnp.log(1 - jnp.tanh(u) ** 2))
    mask = np.arange(7)[None] < np.array([LAYOUT.action_sizes[d] for d in [0, 1, 0, 1, 1, 0]])[:, None]
    np.testing.assert_allclose(logp, jnp.sum(jnp.where(mask, per_dim, 0.0), -1), rtol=2e-3, atol=2e-3)
    mean_action = networks.mean_action(state.actor_params, obs)
    np.testing.assert_array_equal(np.asarray(mean_action)[~mask], 0.0)
    np.testing.assert_allclose(np.asarray(mean_action)[mask], np.tanh(np.asarray(mean))[mask], rtol=1e-6)


def test_sac_entropy_target_follows_each_rows_action_size():
    networks, state = heads_sac.init(jax.random.key(0), LAYOUT, SAC_CONFIG)
    _, actor_loss, _ = make_losses(networks, SAC_CONFIG)
    for devices, dims in (([0] * 4, 1.0), ([1] * 4, 7.0), ([0, 1, 0, 1], 4.0)):
        _, aux = actor_loss(state.actor_params, state.critic_params, 0.1, _batch(devices), jax.random.key(2))
        assert float(aux["target_entropy"]) == pytest.approx(-dims)


@pytest.mark.parametrize("name", ["sac", "rlpd"])
def test_sac_update_on_device_a_leaves_device_b_heads_untouched(name):
    algo = over(resolve(name, ddpg.DDPGConfig(), SAC_CONFIG), LAYOUT)
    networks, state = algo.init(jax.random.key(0), LAYOUT.observation_spec, LAYOUT.action_spec)
    if name == "rlpd":
        assert state.critic_params["norms"][0]["scale"].shape == (10, 16)  # LayerNorm in each of 10 critics
    update = jax.jit(sac.make_update(networks, algo.config))
    new, metrics = update(state, _batch([0] * 8))
    assert all(np.isfinite(float(v)) for v in metrics.values())
    critic_new = new.critic_params
    for params, new_params in ((state.actor_params, new.actor_params), (state.critic_params, critic_new)):
        assert moved(params["inputs"][0], new_params["inputs"][0]) > 0
        assert moved(params["outputs"][0], new_params["outputs"][0]) > 0
        assert moved(params["inputs"][1], new_params["inputs"][1]) == 0.0
        assert moved(params["outputs"][1], new_params["outputs"][1]) == 0.0
        assert moved(params["trunk"], new_params["trunk"]) > 0
    for device_id, kind in enumerate(LAYOUT.kinds):
        policy = JaxPolicy(algo, LAYOUT, device_id)
        obs = {s.name: np.ones(s.shape, np.float32) for s in kind.observation_spec.specs}
        for explore in (True, False):
            a, _ = policy.act(obs, explore=explore)
            assert a.shape == kind.action_spec.shape
            assert np.all(a >= kind.action_spec.minimum) and np.all(a <= kind.action_spec.maximum)


@pytest.mark.parametrize("name", ["td3", "sac"])
def test_each_devices_numpy_export_acts_like_its_device_policy_and_follows_published_weights(name, tmp_path):
    from embodyrl.cli.export import export_device
    from embodyrl.hal import params as flat_params
    from embodyrl.hal import runtime
    from embodyrl.hal.steps import PolicyVersion

    algo = over(resolve(name, CONFIG, SAC_CONFIG), LAYOUT)
    networks, state = algo.init(jax.random.key(4), LAYOUT.observation_spec, LAYOUT.action_spec)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda p: rng.normal(0, 0.5, p.shape).astype(np.float32), state.actor_params)
    published = flat_params.flatten({"actor": params})
    for device_id, kind in enumerate(LAYOUT.kinds):
        policy = JaxPolicy(algo, LAYOUT, device_id)
        policy.load_weights(PolicyVersion(0, 3), published)
        stale = jax.tree.map(lambda p: rng.normal(0, 0.5, p.shape).astype(np.float32), state.actor_params)
        numpy_policy = runtime.load(runtime.save(tmp_path / f"{name}-{device_id}",
                                                 *export_device(algo, LAYOUT, stale, device_id))[0])
        assert numpy_policy.observation_spec == kind.observation_spec
        assert numpy_policy.action_spec == kind.action_spec  # the device's own specs, no padding
        numpy_policy.load_weights(PolicyVersion(0, 3), published)  # every head is published; it takes its own
        for _ in range(5):
            obs = {s.name: rng.normal(size=s.shape).astype(np.float32) for s in kind.observation_spec.specs}
            expected, _ = policy.act(obs, explore=False)
            np.testing.assert_allclose(numpy_policy.mean_action(obs), expected, rtol=1e-4, atol=1e-5)
            explored, _ = numpy_policy.act(obs)
            assert explored.shape == kind.action_spec.shape
    with pytest.raises(ValueError, match="declares 2 kinds"):
        export_device(algo, LAYOUT, params, 2)
