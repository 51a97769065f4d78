"""The data-parallel update equals the single-device one (4 forced CPU devices, in a subprocess)."""

import subprocess
import sys
import textwrap


def test_sharded_update_equals_single_device_update():
    code = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, jax.numpy as jnp, numpy as np
        from embodyrl.algos import ddpg, sac
        from embodyrl.algos.parallel import data_parallel
        from embodyrl.hal.specs import ArraySpec, DictSpec
        assert len(jax.devices()) == 4, jax.devices()
        OBS = DictSpec.of(ArraySpec("x", (5,), np.float32))
        ACT = ArraySpec("action", (2,), np.float32, -1, 1)
        rng = np.random.default_rng(0)
        def batches(K, B):
            return {"observation": {"x": rng.normal(size=(K, B, 5)).astype(np.float32)},
                    "action": rng.uniform(-1, 1, (K, B, 2)).astype(np.float32),
                    "reward": rng.normal(size=(K, B)).astype(np.float32),
                    "discount": np.full((K, B), 0.9, np.float32),
                    "next_observation": {"x": rng.normal(size=(K, B, 5)).astype(np.float32)}}
        for algo, cfg in ((ddpg, ddpg.td3(ddpg.DDPGConfig(hidden_sizes=(32, 32)))),
                          (sac, sac.SACConfig(hidden_sizes=(32, 32)))):
            networks, state = algo.init(jax.random.key(0), OBS, ACT, cfg)
            update_many = algo.make_update_many(networks, cfg)
            data = batches(3, 64)
            single, m1 = jax.jit(update_many)(state, data)
            parallel = data_parallel(update_many, batch_axis=1, donate_state=False)
            multi, m2 = parallel(state, data)
            assert len(multi.actor_params["layers"][0]["kernel"].sharding.device_set) == 4
            for a, b in zip(jax.tree.leaves(single._replace(key=0)), jax.tree.leaves(multi._replace(key=0))):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(float(m1["critic_loss"]), float(m2["critic_loss"]), rtol=1e-4)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
