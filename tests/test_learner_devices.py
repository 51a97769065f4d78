"""A learner's update over several devices (``--xla_force_host_platform_device_count``), through the
real learner service: the same updates as on one device within float tolerance, for every
registered algorithm; a checkpoint from 4 devices resumed on 1; refusals that name the numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from embodyrl.algos import registry

THROUGH_THE_LEARNER = r"""
import dataclasses, json, sys, tempfile
from pathlib import Path
import numpy as np
from embodyrl.algos import registry
from embodyrl.config import LearnerConfig, TrainConfig
from embodyrl.hal.layout import Layout
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import PolicyVersion, StepRecorder
from embodyrl.learner import build_learner

name, counts = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
discrete = name == "dqn"
OBS = DictSpec.of(ArraySpec("x", (3,), np.float32))
ACT = ArraySpec("action", (), np.int32, 0, 2) if discrete else ArraySpec("action", (2,), np.float32, -1, 1)
LAYOUT = Layout.of("toy", OBS, ACT)
CALLS, K = 3, 2

def config(devices):
    lc = LearnerConfig(min_replay=64, replay_capacity=4096, replay_chunk_rows=256, updates_per_step=100.0,
                       updates_per_call=K, publish_every=10**6, prefetch_batches=0, checkpoint_every_s=3600,
                       log_every_s=3600, devices=devices)
    c = TrainConfig(steps=0, learner=lc, algorithm=name)
    section_name = registry.get(name).section
    section = dataclasses.replace(getattr(c, section_name), hidden_sizes=(16,))
    if section_name == "ppo":
        section = dataclasses.replace(section, rollouts_per_iteration=4, rollout_length=8, minibatches=2)
    else:
        section = dataclasses.replace(section, batch_size=32)
    return dataclasses.replace(c, **{section_name: section})

def feed(learner):
    rng = np.random.default_rng(1)
    recorder = StepRecorder(OBS, ACT, actor_id=1, device_id=0)
    version = PolicyVersion(7, 0)
    for seq in range(1, 9):
        for t in range(20):
            action = np.int32(rng.integers(0, 3)) if discrete else rng.uniform(-1, 1, 2).astype(np.float32)
            recorder.add({"x": rng.normal(size=3).astype(np.float32)}, action, action,
                         float(rng.normal()), False, t == 19, version)
        recorder.add_final({"x": rng.normal(size=3).astype(np.float32)})
        learner.data.add(recorder.flush(), seq, 1)
    learner.data.commit(final=True)

def weights(learner):
    return {k: np.asarray(v).tolist() for k, v in learner.training.actor_weights().items()}

out = {}
root = Path(tempfile.mkdtemp())
for count in counts:
    learner = build_learner(config(count), LAYOUT, root / str(count))
    if learner.training.name == "ppo":  # on-policy: one iteration on a rollout batch laid out as a real one
        batch = learner.data.example_batch()
        batch = {k: (np.random.default_rng(2).normal(size=np.shape(v)).astype(v.dtype)
                     if k in ("reward",) else v) for k, v in batch.items()}
        for _ in range(CALLS):
            learner.training.update(batch)
        learner.counters.updates += CALLS
    else:
        feed(learner)
        for _ in range(CALLS):
            assert learner.train()
    out[count] = {"weights": weights(learner), "updates": learner.counters.updates,
                  "devices": learner.training.placement.count}
    learner.shutdown("done")  # checkpoints the state
# the last run's checkpoint, resumed on one device
learner = build_learner(config(1), LAYOUT, root / str(counts[-1]))
out["resumed"] = {"weights": weights(learner), "updates": learner.counters.updates, "resumed": learner.resumed,
                  "devices": learner.training.placement.count}
learner.shutdown("done")
print(json.dumps(out))
"""


def _run(script: str, *args: str, devices: int = 4, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=2e-4, atol=2e-5, err_msg=key)


@pytest.mark.parametrize("name", ["ddpg", "sac"])
def test_four_devices_make_the_same_updates_as_one_and_resume_on_one(name):
    proc = _run(THROUGH_THE_LEARNER, name, "1,4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    one, four, resumed = out["1"], out["4"], out["resumed"]
    assert (one["devices"], four["devices"], resumed["devices"]) == (1, 4, 1)
    assert one["updates"] == four["updates"] == 6
    _same(one["weights"], four["weights"])
    assert resumed["resumed"] and resumed["updates"] == four["updates"]
    _same(four["weights"], resumed["weights"])  # the 4-device checkpoint, exactly, on one device


@pytest.mark.parametrize("name", [n for n in registry.names() if n not in ("ddpg", "sac")])
def test_every_other_registered_algorithm_splits_its_update_too(name):
    assert registry.get(name).shard_by is not None  # none is registered as unable to split
    proc = _run(THROUGH_THE_LEARNER, name, "1,2", devices=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    _same(out["1"]["weights"], out["2"]["weights"])


def test_a_batch_that_does_not_split_is_refused_at_start_naming_both_numbers(tmp_path):
    from embodyrl.learner.devices import check_batch, resolve

    check_batch(256, 4)
    with pytest.raises(ValueError, match="batch size 100 does not divide by the 3 devices"):
        check_batch(100, 3)
    with pytest.raises(ValueError, match="learner.devices: 64 asked, this host has 1"):
        resolve(64)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "embodyrl.cli", "train", "pendulum", "--learner.devices", "3",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    assert "the sac.batch_size 256 does not divide by the 3 devices" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "embodyrl.cli", "train", "pendulum", "--algorithm", "ppo",
                           "--learner.devices", "3", "--run-dir", str(tmp_path / "ppo")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "ppo.rollouts_per_iteration 8 does not divide by the 3 devices" in proc.stderr


def test_the_devices_setting_takes_a_count_or_all():
    from embodyrl.config import LearnerConfig, build_config, default_config, from_dict

    assert from_dict(LearnerConfig, {"devices": 2}).devices == 2
    assert from_dict(LearnerConfig, {"devices": "all"}).devices == "all"
    base = default_config("pendulum")
    assert build_config(base, None, [("learner.devices", "2")]).learner.devices == 2
    assert build_config(base, None, [("learner.devices", "all")]).learner.devices == "all"
    for bad in ("many", 0, -1, True):
        with pytest.raises(ValueError, match="learner.devices: expected a positive count or 'all'"):
            LearnerConfig(devices=bad)


def test_a_learner_with_several_devices_trains_pendulum_end_to_end(tmp_path):
    """``embodyrl train pendulum --learner.devices 2``: the learner, its actor, the replay and the
    published weights, with the update split over two forced CPU devices."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "embodyrl.cli", "train", "pendulum", "--learner.devices", "2",
                           "--steps", "1500", "--learner.min_replay", "500", "--eval_episodes", "1",
                           "--quiet", "--run-dir", str(run)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["env_steps"] >= 1500
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("updates", 0) for r in records) > 0
    assert json.loads((run / "config.json").read_text())["learner"]["devices"] == 2
