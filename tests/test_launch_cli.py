"""``embodyrl launch``: ``local`` is ``train``; ``ray`` without Ray names the extra to install."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli_helpers import in_process


def test_launch_ray_without_ray_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as in an interpreter where `import ray` fails
    proc = in_process("launch", "ray", "pendulum", "--steps", "10", "--run-dir", tmp_path / "r")
    assert proc.returncode == 2
    assert "pip install 'embodyrl[ray]'" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_launch_refuses_a_resource_map_that_is_not_one(tmp_path):
    proc = in_process("launch", "ray", "pendulum", "--learner-resources", "[1]")
    assert proc.returncode == 2 and "expected a JSON map of resource -> amount" in proc.stderr


def test_launch_local_is_train(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "embodyrl.cli", "launch", "local", "pendulum", "--steps", "400",
                           "--eval_episodes", "1", "--sac.hidden_sizes", "[16, 16]", "--learner.min_replay", "200",
                           "--actor.random_steps", "200", "--quiet", "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["env_steps"] >= 400
