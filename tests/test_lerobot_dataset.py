"""Demonstrations as LeRobotDataset v3.0, through embodyrl's own reader and writer (pyarrow, PyAV): the
round trip, the layout's invariants, recording straight into one, training from one, and refusals.
LeRobot's own loader and writer judge the same files in ``test_lerobot_dataset_real.py`` (slow)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("av")

from embodyrl.envs.lerobot_arm import NAMES  # noqa: E402
from embodyrl.hal import lerobot_demos  # noqa: E402
from embodyrl.hal.demos import demo_files, load_demonstrations, read_specs  # noqa: E402
from embodyrl.hal.lerobot_dataset import read_episodes, read_info  # noqa: E402
from embodyrl.hal.specs import ArraySpec, DictSpec, SpecError  # noqa: E402
from tests.cli_helpers import in_process  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TELEOP = "lerobot:embodyrl.envs.lerobot_arm.leader:rest_polls=2,move_polls=10"
STEPS = 30


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The simulated follower with a 32x24 camera, 3 episodes of 30 steps recorded as .npz, exported."""
    home = tmp_path_factory.mktemp("dataset")
    data = yaml.safe_load((ROOT / "examples" / "robots" / "lerobot_sim_arm.yaml").read_text())
    data["device"]["args"] = {"cameras": {"front": {"width": 32, "height": 24}}}
    data["cameras"] = ["front"]
    data["control"]["episode_steps"] = STEPS
    (home / "arm.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    proc = in_process("record", "arm.yaml", "--teleop", TELEOP, "--episodes", "3", "--out", "demos", "--unpaced",
                      cwd=home)
    assert proc.returncode == 0, proc.stderr
    proc = in_process("demos", "demos", "--export", "lerobot", "--out", "exported", "--task", "reach the pose",
                      cwd=home)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"episodes": 3, "frames": 3 * STEPS, "fps": 50.0, "out": "exported"}
    return home


def _recorded_steps(home: Path):
    return [load_demonstrations(path, batch_rows=10_000)[0] for path in demo_files([home / "demos"])]


def test_the_round_trip_keeps_every_frame(recorded):
    observation_spec, action_spec = read_specs(demo_files([recorded / "demos"])[0])
    back = lerobot_demos.load(recorded / "exported", observation_spec, action_spec, batch_rows=10_000)
    assert len(back) == 3
    for original, read in zip(_recorded_steps(recorded), back, strict=True):
        acted = slice(0, STEPS)
        np.testing.assert_array_equal(read.observation["state"][acted], original.observation["state"][acted])
        np.testing.assert_array_equal(read.action[acted], original.action[acted])
        np.testing.assert_array_equal(read.reward[acted], original.reward[acted])
        assert (read.terminated[acted] == original.terminated[acted]).all()
        assert (read.truncated[acted] == original.truncated[acted]).all()
        assert read.final.tolist() == original.final.tolist()
        difference = np.abs(read.observation["front"][acted].astype(int) - original.observation["front"][acted])
        assert difference.max() <= 32 and difference.mean() < 2, (difference.max(), difference.mean())
        # o_T is not kept in LeRobot's format: read back, the final row repeats the last frame's
        np.testing.assert_array_equal(read.observation["state"][-1], original.observation["state"][STEPS - 1])
        assert (read.source == 1).all()  # demonstrations, as every --demos row is


def test_the_layout_is_lerobots_v3(recorded):
    root = recorded / "exported"
    proc = in_process("demos", "exported", cwd=recorded)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    assert (said["episodes"], said["frames"], said["fps"], said["tasks"]) == (3, 3 * STEPS, 50, ["reach the pose"])
    info = read_info(root)
    assert info["codebase_version"] == "v3.0" and info["fps"] == 50 and isinstance(info["fps"], int)
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 3 * STEPS, 1)
    features = info["features"]
    assert features["observation.state"] == {"dtype": "float32", "shape": [7], "names": list(NAMES)}
    assert features["action"]["names"] == list(NAMES)
    assert features["observation.images.front"]["dtype"] == "video"
    assert features["observation.images.front"]["shape"] == [24, 32, 3]
    for name in ("next.reward", "next.done", "next.truncated", "embodyrl.source", "embodyrl.proposed_action",
                 "timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert name in features, name
    data = pa.concat_tables([pq.read_table(p) for p in sorted(root.glob("data/*/*.parquet"))])
    assert "observation.images.front" not in data.column_names  # videos live in their MP4s
    assert data.column("index").to_pylist() == list(range(3 * STEPS))
    assert data.schema.field("observation.state").type == pa.list_(pa.float32(), 7)
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(e["episode_index"], e["length"], e["dataset_from_index"], e["dataset_to_index"]) for e in episodes] == \
        [(i, STEPS, i * STEPS, (i + 1) * STEPS) for i in range(3)]
    for e in episodes:
        video = root / info["video_path"].format(video_key="observation.images.front",
                                                 chunk_index=e["videos/observation.images.front/chunk_index"],
                                                 file_index=e["videos/observation.images.front/file_index"])
        assert video.is_file()
        assert e["videos/observation.images.front/to_timestamp"] == pytest.approx(STEPS / 50)
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["__index_level_0__"]
    assert tasks.column("__index_level_0__").to_pylist() == ["reach the pose"]
    stats = json.loads((root / "meta/stats.json").read_text())
    assert stats["observation.state"]["count"] == [3 * STEPS] and len(stats["observation.state"]["q50"]) == 7
    assert np.array(stats["observation.images.front"]["mean"]).shape == (3, 1, 1)
    all_states = data.column("observation.state").to_numpy(zero_copy_only=False)
    np.testing.assert_allclose(stats["observation.state"]["mean"], np.stack(all_states).mean(0), rtol=1e-5)


def test_record_straight_into_a_dataset_and_resume(recorded, tmp_path):
    shutil.copy(recorded / "arm.yaml", tmp_path / "arm.yaml")
    for episodes in ("1", "2"):
        proc = in_process("record", "arm.yaml", "--teleop", TELEOP, "--episodes", episodes, "--out", "ds",
                          "--format", "lerobot", "--unpaced", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"directory": "ds", "format": "lerobot", "episodes": 2, "frames": 2 * STEPS}
    info, episodes = read_episodes(tmp_path / "ds")
    assert info["total_episodes"] == 2 and [e.length for e in episodes] == [STEPS, STEPS]
    assert episodes[0].task == "lerobot_arm_pose"  # the task's name where no --task is given
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    proc = in_process("record", "arm.yaml", "--teleop", TELEOP, "--episodes", "1", "--out", "other", "--format",
                      "lerobot", "--unpaced", cwd=tmp_path)
    assert proc.returncode == 2 and "holds files but no LeRobotDataset" in proc.stderr


def test_a_dataset_that_does_not_fit_is_refused_naming_the_field(recorded):
    observation_spec, action_spec = read_specs(demo_files([recorded / "demos"])[0])
    root = recorded / "exported"
    renamed = ArraySpec("state", (7,), np.float32, names=tuple(n.replace("j", "joint") for n in NAMES))
    other = DictSpec((renamed, observation_spec["front"]))
    assert "observation 'state': the dataset's elements are" in lerobot_demos.check(root, other, action_spec)
    wider = DictSpec((ArraySpec("state", (8,), np.float32), observation_spec["front"]))
    assert "observation 'state': the dataset's is [7]; the task's is [8]" in lerobot_demos.check(root, wider, action_spec)
    extra = DictSpec((*observation_spec.specs, ArraySpec("wrist", (12, 16, 3), np.uint8, 0, 255)))
    reason = lerobot_demos.check(root, extra, action_spec)
    assert "observation 'wrist': the dataset has no feature 'observation.images.wrist'" in reason
    assert lerobot_demos.check(root, extra, action_spec, {"wrist": "observation.images.front"}) == \
        "observation 'wrist': the dataset's frames are [24, 32, 3]; the task's are [12, 16, 3]"
    with pytest.raises(SpecError, match="the dataset has no feature"):
        lerobot_demos.load(root, extra, action_spec)


def test_elements_are_matched_by_name_whatever_their_order(recorded):
    observation_spec, action_spec = read_specs(demo_files([recorded / "demos"])[0])
    reordered = ArraySpec("state", (7,), np.float32, names=tuple(reversed(NAMES)))
    back = lerobot_demos.load(recorded / "exported", DictSpec((reordered, observation_spec["front"])), action_spec,
                              batch_rows=10_000)
    original = _recorded_steps(recorded)[0]
    np.testing.assert_array_equal(back[0].observation["state"][:STEPS], original.observation["state"][:STEPS, ::-1])


def test_train_from_a_dataset_loads_it_once_by_content(recorded):
    """The arm without its camera: the fields a task reads are taken, the dataset's others left."""
    shutil.copy(ROOT / "examples" / "robots" / "lerobot_sim_arm.yaml", recorded / "blind.yaml")
    proc = in_process("train", "blind.yaml", "--algorithm", "sac", "--demos", "exported", "--run-dir", "run",
                      "--steps", "300", "--eval_episodes", "1", "--sac.hidden_sizes", "[16, 16]",
                      "--learner.min_replay", "100", "--actor.random_steps", "100", "--quiet", cwd=recorded)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ledger = json.loads((recorded / "run" / "replay" / "demonstrations.json").read_text())["files"]
    assert [(e["name"], e["steps"]) for e in ledger] == [("exported", 3 * (STEPS + 1))]
    assert ledger[0]["sha256"] == lerobot_demos.content_hash(recorded / "exported")


def test_a_robot_file_maps_a_field_to_a_feature_named_otherwise(recorded, tmp_path):
    from embodyrl import robot

    data = yaml.safe_load((recorded / "arm.yaml").read_text())
    data["dataset_features"] = {"front": "observation.images.top"}
    (tmp_path / "arm.yaml").write_text(yaml.safe_dump(data))
    defaults = robot.load(str(tmp_path / "arm.yaml")).config_defaults()
    assert defaults["learner"]["demos_features"] == {"front": "observation.images.top"}
    observation_spec, action_spec = read_specs(demo_files([recorded / "demos"])[0])
    reason = lerobot_demos.check(recorded / "exported", observation_spec, action_spec, {"front": "observation.images.top"})
    assert "the mapping names feature 'observation.images.top', which the dataset lacks" in reason
    data["dataset_features"] = {"wrist": "observation.images.top"}
    (tmp_path / "arm.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(robot.RobotFileError, match="dataset_features.wrist: 'wrist' is not an observation field"):
        robot.load(str(tmp_path / "arm.yaml")).layout()


def test_a_v21_dataset_is_read_too(recorded, tmp_path):
    """LeRobot's previous layout: one Parquet and one MP4 per episode, JSON-lines metadata."""
    from embodyrl.hal.lerobot_dataset import _encode

    source = recorded / "exported"
    info, episodes = read_episodes(source)
    data = pa.concat_tables([pq.read_table(p) for p in sorted(source.glob("data/*/*.parquet"))])
    old = tmp_path / "v21"
    lines = []
    for number, episode in enumerate(episodes):
        rows = data.filter(pa.array(data.column("episode_index").to_numpy() == number))
        path = old / f"data/chunk-000/episode_{number:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, path)
        _encode(old / f"videos/chunk-000/observation.images.front/episode_{number:06d}.mp4",
                episode.features["observation.images.front"], info["fps"])
        lines.append(json.dumps({"episode_index": number, "tasks": ["reach the pose"], "length": episode.length}))
    (old / "meta").mkdir()
    (old / "meta/episodes.jsonl").write_text("\n".join(lines) + "\n")
    (old / "meta/tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": "reach the pose"}) + "\n")
    legacy = {**info, "codebase_version": "v2.1",
              "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
              "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"}
    (old / "meta/info.json").write_text(json.dumps(legacy))
    _, read = read_episodes(old)
    assert [e.length for e in read] == [STEPS] * 3 and read[1].task == "reach the pose"
    np.testing.assert_array_equal(read[2].features["observation.state"], episodes[2].features["observation.state"])
    difference = np.abs(read[0].features["observation.images.front"].astype(int)
                        - episodes[0].features["observation.images.front"])
    assert difference.mean() < 2
