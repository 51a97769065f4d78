"""The task registry: names, gym:ID tasks, and the project's tasks registered with Gymnasium."""

import json
import os
import signal
import subprocess
import sys

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import embodyrl.hal.drivers.mujoco  # noqa: F401  (headless GL before gymnasium imports mujoco)
from embodyrl import envs
from tests.cli_helpers import in_process


def test_names_and_gym_ids_are_known_and_the_rest_is_named_in_the_error():
    assert {"pendulum", "pendulum_pixels", "arm_reach"} <= set(envs.names())
    assert envs.is_known("pendulum") and envs.is_known("gym:Pendulum-v1")
    assert envs.is_known("gym:embodyrl/Pendulum-v0")  # our own task, the long way round
    for name in ("cartwheel", "gym:", "gym:Nope-v0", "Pendulum-v1"):
        assert not envs.is_known(name), name
    assert "unknown Gymnasium id 'Nope-v0'" in envs.unknown_reason("gym:Nope-v0")
    assert "known: arm_push, arm_reach" in envs.unknown_reason("cartwheel") and "gym:ID" in envs.unknown_reason("cartwheel")
    with pytest.raises(KeyError, match="unknown task 'cartwheel'"):
        envs.make("cartwheel")


def test_every_task_has_a_gymnasium_id_unless_it_is_a_gymnasium_env():
    from_gymnasium = {n for n, target in envs._REGISTRY.items() if target.startswith("embodyrl.envs.gym_tasks:")}
    assert set(envs.names()) - set(envs.GYMNASIUM_IDS) == from_gymnasium, "add the new task to GYMNASIUM_IDS"


@pytest.mark.parametrize("task", sorted(envs.GYMNASIUM_IDS))
def test_registered_time_limits_are_the_tasks_own(task):
    _, task_object = envs.make(task)
    assert envs.GYMNASIUM_IDS[task][1] == task_object.max_episode_steps


def test_gymnasium_make_builds_a_task_that_passes_check_env_and_truncates():
    envs.register_gymnasium()
    env = gymnasium.make("embodyrl/Pendulum-v0")
    check_env(env.unwrapped, skip_render_check=True)
    assert env.spec.max_episode_steps == 200
    env.reset(seed=0)
    zero = np.zeros(env.action_space.shape, env.action_space.dtype)
    for t in range(1, 201):
        _, reward, terminated, truncated, _ = env.step(zero)
        assert np.isfinite(reward) and not terminated
        assert truncated == (t == 200)
    env.close()


def test_module_colon_id_works_in_a_fresh_process():
    """``gymnasium.make("embodyrl.envs:embodyrl/ArmReach-v0")`` needs no set-up beyond the install."""
    code = ("import gymnasium; env = gymnasium.make('embodyrl.envs:embodyrl/ArmReach-v0'); "
            "obs, _ = env.reset(seed=1); print(sorted(obs))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "target_pos" in out.stdout


def test_tasks_command_lists_names_and_ids():
    out = in_process("tasks", "--json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    assert listed["tasks"] == envs.names()
    assert listed["gymnasium_ids"]["pendulum"] == "embodyrl/Pendulum-v0"
    assert "gym:ID" in in_process("tasks").stdout


def test_unknown_gym_id_is_exit_2():
    out = in_process("train", "gym:Nope-v0", "--steps", "10")
    assert out.returncode == 2
    assert "unknown Gymnasium id 'Nope-v0'" in out.stderr


def test_train_a_gymnasium_id(tmp_path):
    """``embodyrl train gym:Pendulum-v1``: Gymnasium's own pendulum through the adapter, end to end."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "embodyrl.cli", "train", "gym:Pendulum-v1", "--steps", "500", "--run-dir",
         str(run_dir), "--quiet", "--eval_episodes", "1", "--ddpg.hidden_sizes", "[16, 16]",
         "--learner.min_replay", "200", "--actor.random_steps", "200"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["env_steps"] >= 500 and np.isfinite(summary["eval_return_mean"])
    assert -200 * 16.3 <= summary["eval_return_mean"] <= 0  # Pendulum-v1's reward range over 200 steps
    assert json.loads((run_dir / "config.json").read_text())["task"] == "gym:Pendulum-v1"
    assert max(json.loads(line)["episodes"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()) >= 2


def test_a_camera_without_an_encoder_is_refused_before_the_run_starts(tmp_path):
    run = tmp_path / "run"
    proc = in_process("train", "pendulum_pixels", "--sac.encoder.image_fields", "[]", "--steps", "10", "--run-dir", str(run))
    assert proc.returncode == 2, proc.stderr
    assert "'camera/front' is a camera image (84x84x3 uint8): set sac.encoder.image_fields to [auto]" in proc.stderr
    assert not run.exists()
