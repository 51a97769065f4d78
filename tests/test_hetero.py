"""Heterogeneous devices: padded rows routed by device id through per-device heads and a shared trunk."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import ddpg, sac
from embodyrl.algos.heads import DeviceKind, DevicePolicy, HeteroLayout, hetero, init
from embodyrl.algos.registry import resolve
from embodyrl.hal.specs import ArraySpec, DictSpec

PENDULUM = DeviceKind("pendulum", DictSpec.of(ArraySpec("orientation", (2,), np.float32),
                                              ArraySpec("angular_velocity", (1,), np.float32)),
                      ArraySpec("action", (1,), np.float32, -2.0, 2.0))
ARM = DeviceKind("arm", DictSpec.of(ArraySpec("qpos", (7,), np.float32), ArraySpec("target", (3,), np.float32)),
                 ArraySpec("action", (7,), np.float32, -5.0, 5.0))
LAYOUT = HeteroLayout((PENDULUM, ARM))
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
    with pytest.raises(ValueError, match="sac is not supported"):
        hetero(resolve("sac", ddpg.DDPGConfig(), sac.SACConfig()), LAYOUT)


def test_actions_respect_each_devices_size_and_bounds():
    networks, state = init(jax.random.key(0), LAYOUT, CONFIG)
    batch = _batch([0, 1, 0, 1])
    action = networks.policy(state.actor_params, batch["observation"])
    assert action.shape == (4, 7)
    np.testing.assert_array_equal(action[0, 1:], 0.0)  # the pendulum row writes one dimension
    assert np.all(np.abs(action[1]) > 0) and np.all(np.abs(action) <= 1.0)
    assert networks.q_values(state.critic_params, batch["observation"], batch["action"]).shape == (2, 4)
    algo = hetero(resolve("td3", CONFIG, None), LAYOUT)
    for device_id, kind in enumerate(LAYOUT.kinds):
        policy = DevicePolicy(algo, device_id)
        obs = {s.name: np.ones(s.shape, np.float32) for s in kind.observation_spec.specs}
        a, _ = policy.act(obs, explore=False)
        assert a.shape == kind.action_spec.shape
        assert np.all(a >= kind.action_spec.minimum) and np.all(a <= kind.action_spec.maximum)


def test_updating_on_device_a_leaves_device_b_heads_untouched_and_moves_the_shared_trunk():
    networks, state = init(jax.random.key(0), LAYOUT, CONFIG)
    update = jax.jit(ddpg.make_update(networks, CONFIG))
    new, metrics = update(state, _batch([0] * 8))  # pendulum rows only; step 0 moves the actor too
    assert np.isfinite(float(metrics["critic_loss"]))

    def moved(before, after):
        return float(sum(jnp.sum(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after),
                                                                  strict=True)))

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
