"""LeRobotDataset judged by LeRobot: what ``embodyrl demos --export lerobot`` and ``record --format
lerobot`` write, LeRobot's own loader reads (episodes, frames, features, a decoded camera frame equal
to the recorded one within the codec's tolerance); and a dataset LeRobot's own writer made trains here.

Slow, and only where LeRobot is installed (``pip install 'embodyrl[lerobot]'``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.slow
pytest.importorskip("lerobot", reason="LeRobot is not installed here: pip install 'embodyrl[lerobot]'")
pytest.importorskip("pyarrow", reason="the dataset extra is not installed: pip install 'embodyrl[dataset]'")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # draccus ships a top-level ``tests`` package
from cli_helpers import in_process  # noqa: E402

from embodyrl.envs.lerobot_arm import GOAL, NAMES  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TELEOP = "lerobot:embodyrl.envs.lerobot_arm.leader:rest_polls=2,move_polls=10"
TOLERANCE = 32  # of 255 at the worst pixel: H.264 4:4:4 at crf 10 on 32x24 rendered frames (hard edges)


@pytest.fixture(scope="module")
def camera_arm(tmp_path_factory):
    """The simulated follower with a 32x24 camera, 40-step episodes, and 3 recorded episodes."""
    home = tmp_path_factory.mktemp("lerobot_data")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_CACHE", str(home / "hf-cache"))
    data = yaml.safe_load((ROOT / "examples" / "robots" / "lerobot_sim_arm.yaml").read_text())
    data["device"]["args"] = {"cameras": {"front": {"width": 32, "height": 24}}}
    data["cameras"] = ["front"]
    data["control"]["episode_steps"] = 40
    (home / "arm.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    proc = in_process("record", "arm.yaml", "--teleop", TELEOP, "--episodes", "3", "--out", "demos", "--unpaced",
                      cwd=home)
    assert proc.returncode == 0, proc.stderr
    return home


def _lerobot(root: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/embodyrl", root=root, video_backend="pyav")


def test_lerobots_loader_reads_an_export_frame_for_frame(camera_arm):
    proc = in_process("demos", "demos", "--export", "lerobot", "--out", "exported", "--task", "reach the pose",
                      cwd=camera_arm)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["episodes"] == 3
    dataset = _lerobot(camera_arm / "exported")
    assert dataset.meta.total_episodes == 3 and len(dataset) == 3 * 40
    assert dataset.meta.fps == 50
    assert dataset.meta.features["observation.state"]["names"] == list(NAMES)
    assert dataset.meta.features["action"]["names"] == list(NAMES)
    from embodyrl.hal.demos import demo_files, load_demonstrations

    recorded = load_demonstrations(demo_files([camera_arm / "demos"])[1], batch_rows=10_000)[0]
    for frame in (0, 17, 39):
        item = dataset[40 + frame]  # episode 1
        assert int(item["episode_index"]) == 1 and int(item["frame_index"]) == frame
        assert item["task"] == "reach the pose"
        np.testing.assert_allclose(item["observation.state"].numpy(), recorded.observation["state"][frame])
        np.testing.assert_allclose(item["action"].numpy(), recorded.action[frame])
        decoded = np.rint(item["observation.images.front"].numpy().transpose(1, 2, 0) * 255).astype(int)
        difference = np.abs(decoded - recorded.observation["front"][frame].astype(int))
        assert difference.max() <= TOLERANCE and difference.mean() < 2, (difference.max(), difference.mean())
    last = dataset[40 + 39]
    assert bool(last["next.done"]) and float(last["next.reward"]) == pytest.approx(float(recorded.reward[39]))


def test_a_recording_in_lerobots_format_is_read_by_lerobot_and_resumes(camera_arm):
    for episodes in ("2", "3"):  # stopped after 2, the same command again records the third
        proc = in_process("record", "arm.yaml", "--teleop", TELEOP, "--episodes", episodes, "--out", "recorded",
                          "--format", "lerobot", "--unpaced", cwd=camera_arm)
        assert proc.returncode == 0, proc.stderr
    dataset = _lerobot(camera_arm / "recorded")
    assert dataset.meta.total_episodes == 3 and len(dataset) == 120
    assert [int(dataset[i]["episode_index"]) for i in (0, 40, 119)] == [0, 1, 2]


def test_a_dataset_lerobots_own_writer_made_trains_here(camera_arm):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from embodyrl.envs.lerobot_arm import HOME

    features = {"observation.state": {"dtype": "float32", "shape": (7,), "names": list(NAMES)},
                "action": {"dtype": "float32", "shape": (7,), "names": list(NAMES)},
                "observation.images.front": {"dtype": "video", "shape": (24, 32, 3),
                                             "names": ["height", "width", "channels"]},
                "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
                "next.done": {"dtype": "bool", "shape": (1,), "names": None}}
    root = camera_arm / "by_lerobot"
    written = LeRobotDataset.create(repo_id="local/by_lerobot", fps=50, features=features, root=root,
                                    use_videos=True)
    rng = np.random.default_rng(0)
    home, goal = (np.array([d[n] for n in NAMES], np.float32) for d in (HOME, GOAL))
    for _ in range(2):
        for t in range(30):
            share = min(1.0, t / 10)
            state = home + share * (goal - home)
            written.add_frame({"observation.state": state, "action": goal,
                               "observation.images.front": rng.integers(0, 256, (24, 32, 3), np.uint8),
                               "next.reward": np.array([-float(np.abs(state - goal).mean()) / 10], np.float32),
                               "next.done": np.array([t == 29]), "task": "reach the pose"})
        written.save_episode()
    written.finalize()
    proc = in_process("train", "arm.yaml", "--algorithm", "sac", "--demos", str(root), "--run-dir", "run",
                      "--steps", "400", "--eval_episodes", "1", "--sac.hidden_sizes", "[16, 16]",
                      "--learner.min_replay", "100", "--actor.random_steps", "100", "--quiet", cwd=camera_arm)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ledger = json.loads((camera_arm / "run" / "replay" / "demonstrations.json").read_text())["files"]
    assert [(e["name"], e["steps"]) for e in ledger] == [("by_lerobot", 2 * 31)]  # 30 frames and a final row each
