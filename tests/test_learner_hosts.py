"""Several learner hosts (``learner.hosts``): two processes on this machine joined by
``jax.distributed`` over CPU collectives (gloo), each with its own replay and actors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.cli_helpers import in_process

TWO_HOSTS = r"""
import dataclasses, json, sys
import numpy as np
from types import SimpleNamespace
from embodyrl.learner.hosts import join

index, port = int(sys.argv[1]), sys.argv[2]
hosts = join(SimpleNamespace(hosts=2, host_index=index, coordinator=f"127.0.0.1:{port}"))
import jax
from embodyrl.algos import registry
from embodyrl.envs import layout as task_layout
from embodyrl.learner.devices import Placement
from embodyrl.learner.service import Training

layout = task_layout("pendulum")
algo = registry.build("sac", dataclasses.replace(registry.get("sac").config_type(), hidden_sizes=(32, 32)))
calls, batch = 2, algo.batch_size
rng = np.random.default_rng(0)  # the same global batch on both hosts; each brings its half
obs = lambda: {"orientation": rng.uniform(-1, 1, (calls, batch, 2)).astype(np.float32),
               "angular_velocity": rng.uniform(-8, 8, (calls, batch, 1)).astype(np.float32)}
data = {"observation": obs(), "next_observation": obs(),
        "action": rng.uniform(-2, 2, (calls, batch, 1)).astype(np.float32),
        "reward": rng.uniform(-10, 0, (calls, batch)).astype(np.float32),
        "discount": np.full((calls, batch), 0.99, np.float32)}
half = batch // 2
mine = jax.tree.map(lambda x: x[:, index * half:(index + 1) * half], data)

def weights(training):
    return {k: np.asarray(v).tolist() for k, v in training.actor_weights().items()}

together = Training.of(algo, layout.observation_spec, layout.action_spec, 0, updates_per_call=calls,
                       publish_every=calls, placement=Placement(hosts=2, host_index=index, batch_size=batch))
metrics = together.update(mine)
alone = Training.of(algo, layout.observation_spec, layout.action_spec, 0, updates_per_call=calls,
                    publish_every=calls)  # this host's first device, the whole batch
alone_metrics = alone.update(data)
turn = hosts.agree(ready=index == 0, env_steps=100 + index, stop=False, checkpoint=index == 1)
print(json.dumps({"together": weights(together), "alone": weights(alone), "devices": together.placement.count,
                  "critic_loss": [float(np.mean(metrics["critic_loss"])), float(np.mean(alone_metrics["critic_loss"]))],
                  "turn": [turn.train, turn.env_steps, turn.stop, turn.checkpoint]}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _kill(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_two_hosts_each_with_half_the_batch_make_the_update_of_the_whole_batch(tmp_path):
    port = str(_free_port())
    # output to files: a host blocked on a full pipe would hold the other at jax.distributed's exit barrier
    outs = [(tmp_path / f"out{i}", tmp_path / f"err{i}") for i in (0, 1)]
    procs = [subprocess.Popen([sys.executable, "-c", TWO_HOSTS, str(i), port], stdout=out.open("w"),
                              stderr=err.open("w"), env=_env(), start_new_session=True)
             for i, (out, err) in enumerate(outs)]
    try:
        for proc in procs:
            proc.wait(timeout=300)
    finally:
        _kill(procs)
    for proc, (_, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err.read_text()[-3000:]
    results = [json.loads(out.read_text().splitlines()[-1]) for out, _ in outs]
    for result in results:
        assert result["devices"] == 2
        for key, value in result["alone"].items():
            np.testing.assert_allclose(result["together"][key], value, rtol=2e-4, atol=2e-5, err_msg=key)
        assert result["critic_loss"][0] == pytest.approx(result["critic_loss"][1], rel=1e-4)
        # host 1 was not ready: nobody trains; steps add up; host 1's due checkpoint is everyone's
        assert result["turn"] == [False, 201, False, True]
    assert results[0]["together"] == results[1]["together"]  # the same weights on both hosts


def _learner(index: int, port: int, run_dir, steps: int, log, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "embodyrl.cli", "learner", "pendulum", "--run-dir", str(run_dir),
         "--steps", str(steps), "--bind", "tcp://127.0.0.1:*", "--sac.hidden_sizes", "[32, 32]",
         "--sac.batch_size", "64", "--learner.min_replay", "200", "--actor.random_steps", "200",
         "--learner.hosts", "2", "--learner.host_index", str(index), "--learner.coordinator", f"127.0.0.1:{port}",
         *extra], stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=_env(), start_new_session=True)


def test_two_learner_hosts_train_one_model_each_from_its_own_actor(tmp_path):
    port, steps = _free_port(), 2400
    runs = [tmp_path / f"host{i}" for i in (0, 1)]
    # stderr to files: a process blocked on a full pipe would stall every host's collectives
    logs = [tmp_path / f"learner{i}.err" for i in (0, 1)] + [tmp_path / f"actor{i}.err" for i in (0, 1)]
    learners = [_learner(i, port, runs[i], steps, logs[i]) for i in (0, 1)]
    actors = []
    try:
        for i, learner in enumerate(learners):
            line = learner.stdout.readline()  # after both joined and compiled
            assert line, logs[i].read_text()[-3000:]
            endpoint = json.loads(line)["endpoint"]
            actors.append(subprocess.Popen(
                [sys.executable, "-m", "embodyrl.cli", "actor", "pendulum", "--connect", endpoint, "--index", "0",
                 "--config", str(runs[i] / "config.json"), "--log-dir", str(tmp_path / f"logs{i}")],
                stdout=subprocess.DEVNULL, stderr=logs[2 + i].open("w"), env=_env(), start_new_session=True))
        outs = [learner.communicate(timeout=600)[0] for learner in learners]
        for i, learner in enumerate(learners):
            assert learner.returncode == 0, logs[i].read_text()[-3000:]
        for i, actor in enumerate(actors):
            assert actor.wait(timeout=60) == 0, logs[2 + i].read_text()[-3000:]
    finally:
        _kill(learners + actors)
    counters = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    assert counters[0]["updates"] == counters[1]["updates"] > 0  # every update taken together
    assert counters[0]["publications"] == counters[1]["publications"]
    assert counters[0]["env_steps"] + counters[1]["env_steps"] >= steps  # the budget counts both hosts
    assert all(c["env_steps"] > 0 for c in counters)
    first, second = (np.load(run / "policy" / "weights.npz") for run in runs)
    assert sorted(first.files) == sorted(second.files)
    for key in first.files:  # one model: the hosts publish the same weights
        np.testing.assert_array_equal(first[key], second[key])
    for run, c in zip(runs, counters, strict=True):  # each host's replay holds its own actor's steps only
        report = in_process("replay", run, "--json")
        assert sum(json.loads(report.stdout)["rows_by_actor"].values()) == c["rows"]
    from embodyrl.learner.checkpoint import Checkpointer

    steps_saved = [Checkpointer(run / "checkpoints").latest_step() for run in runs]
    assert steps_saved[0] == steps_saved[1] == counters[0]["updates"]  # checkpoints at the same update


def test_train_refuses_several_hosts_and_a_host_needs_the_coordinator(tmp_path):
    proc = in_process("train", "pendulum", "--learner.hosts", "2", "--learner.coordinator", "127.0.0.1:1",
                      "--run-dir", tmp_path / "r")
    assert proc.returncode == 2 and "start one `embodyrl learner` per host" in proc.stderr
    proc = in_process("learner", "pendulum", "--learner.hosts", "2", "--run-dir", tmp_path / "l")
    assert proc.returncode == 2 and "learner.coordinator: several hosts need host 0's HOST:PORT" in proc.stderr
