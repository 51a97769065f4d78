"""A learner's update over several devices (``--xla_force_host_platform_device_count``): the same
updates as on one device, within float tolerance; a batch that does not split is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SAME_UPDATES = r"""
import json, sys
import jax, numpy as np
from embodyrl.algos import registry
from embodyrl.envs import layout as task_layout
from embodyrl.learner.devices import resolve
from embodyrl.learner.service import Training

name = sys.argv[1]
layout = task_layout("pendulum")
algo = registry.build(name)
rng = np.random.default_rng(0)
calls, batch = 2, algo.batch_size
obs = lambda: {"orientation": rng.uniform(-1, 1, (calls, batch, 2)).astype(np.float32),
               "angular_velocity": rng.uniform(-8, 8, (calls, batch, 1)).astype(np.float32)}
data = {"observation": obs(), "next_observation": obs(),
        "action": rng.uniform(-2, 2, (calls, batch, 1)).astype(np.float32),
        "reward": rng.uniform(-10, 0, (calls, batch)).astype(np.float32),
        "discount": np.full((calls, batch), 0.99, np.float32)}
out = {}
for count in (1, 4):
    training = Training.of(algo, layout.observation_spec, layout.action_spec, 0, updates_per_call=calls,
                           publish_every=calls, devices=resolve(count))
    metrics = training.update(data)
    weights = training.actor_weights()
    out[count] = {"weights": {k: np.asarray(v).tolist() for k, v in weights.items()},
                  "metrics": {k: float(np.mean(v)) for k, v in metrics.items() if np.ndim(v) <= 1}}
print(json.dumps(out))
"""


def _run(script: str, *args: str, devices: int = 4) -> subprocess.CompletedProcess:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("name", ["ddpg", "sac"])
def test_four_devices_make_the_same_update_as_one(name):
    import numpy as np

    proc = _run(SAME_UPDATES, name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    one, four = out["1"], out["4"]
    assert one["weights"].keys() == four["weights"].keys()
    for key in one["weights"]:
        np.testing.assert_allclose(four["weights"][key], one["weights"][key], rtol=2e-4, atol=2e-5, err_msg=key)
    for key, value in one["metrics"].items():
        assert four["metrics"][key] == pytest.approx(value, rel=1e-3, abs=1e-4), key


def test_a_batch_that_does_not_split_is_refused_naming_both_numbers():
    from embodyrl.learner.devices import check_batch, resolve

    check_batch(256, [None] * 4)
    with pytest.raises(ValueError, match="batch size 100 does not divide by the 3 devices"):
        check_batch(100, [None] * 3)
    with pytest.raises(ValueError, match="learner.devices: 64 asked, this host has 1"):
        resolve(64)
    with pytest.raises(ValueError, match="expected a count or 'all'"):
        resolve("many")
