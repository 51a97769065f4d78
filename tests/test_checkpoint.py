import jax
import numpy as np
import pytest

from embodyrl.algos import ddpg, sac
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.learner.checkpoint import Checkpointer

OBS = DictSpec.of(ArraySpec("x", (3,), np.float32))
ACT = ArraySpec("action", (1,), np.float32, -1, 1)


@pytest.mark.parametrize(("algo", "config"), [(ddpg, ddpg.td3(ddpg.DDPGConfig(hidden_sizes=(8,)))),
                                              (sac, sac.SACConfig(hidden_sizes=(8,)))])
def test_state_and_record_round_trip_exactly(tmp_path, algo, config):
    networks, state = algo.init(jax.random.key(0), OBS, ACT, config)
    batch = {"observation": {"x": np.ones((4, 3), np.float32)}, "action": np.zeros((4, 1), np.float32),
             "reward": np.ones(4, np.float32), "discount": np.full(4, 0.9, np.float32),
             "next_observation": {"x": np.zeros((4, 3), np.float32)}}
    state, _ = jax.jit(algo.make_update(networks, config))(state, batch)
    ckpt = Checkpointer(tmp_path / "ckpt", max_to_keep=2)
    for step in (10, 20, 30):
        ckpt.save(step, state, {"updates": step, "version": [7, step]})
    assert ckpt.latest_step() == 30
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == ["20", "30"]
    ckpt.close()
    _, fresh = algo.init(jax.random.key(99), OBS, ACT, config)
    restored, record = Checkpointer(tmp_path / "ckpt").restore(fresh)
    assert record == {"updates": 30, "version": [7, 30]}
    for a, b in zip(jax.tree.leaves(jax.tree.map(jax.random.key_data, state.key)),
                    jax.tree.leaves(jax.tree.map(jax.random.key_data, restored.key)), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(state._replace(key=0)), jax.tree.leaves(restored._replace(key=0)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the restored state trains on exactly as the original would
    s1, m1 = jax.jit(algo.make_update(networks, config))(state, batch)
    s2, m2 = jax.jit(algo.make_update(networks, config))(restored, batch)
    assert float(m1["critic_loss"]) == float(m2["critic_loss"])


def test_no_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Checkpointer(tmp_path / "empty").restore({"w": np.zeros(2)})
