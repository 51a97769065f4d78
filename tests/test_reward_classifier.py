"""A learnt success reward: frames labelled by the last-k rule, a CNN trained through the command
line, its numpy export equal to the JAX model, and a robot file paying its verdict.

The scene is drawn, not rendered: a noisy 24x24 camera frame with a faint green target in the middle
and a red block. Successful episodes end with the block on the target for their last frames; failed
ones never bring it there. :class:`Scene` is the same scene as a device (the action moves the block),
for robot files (``device.factory: test_reward_classifier:scene``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
import yaml

from embodyrl import robot
from embodyrl.cli.commands import main
from embodyrl.hal.classifier import ClassifierError, SuccessClassifier, load_classifier, sigmoid
from embodyrl.hal.demos import DemoWriter
from embodyrl.hal.device import Device
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import PolicyVersion, StepRecorder
from embodyrl.reward.dataset import last_k_labels, load_frames, split_episodes
from tests.cli_helpers import in_process

SIDE, BLOCK, CAMERA, LAST_K, STEPS = 24, 6, "camera/front", 3, 14
CENTRE = (SIDE - BLOCK) / 2  # the block's corner when it covers the target
OBS = DictSpec.of(ArraySpec(CAMERA, (SIDE, SIDE, 3), np.uint8), ArraySpec("block", (2,), np.float32))
ACT = ArraySpec("action", (2,), np.float32, -1, 1)


def draw(rng: np.random.Generator, block: np.ndarray) -> np.ndarray:
    """The camera frame with the block's top-left corner at ``block`` (row, column)."""
    image = rng.integers(0, 40, (SIDE, SIDE, 3), dtype=np.uint8)
    middle = SIDE // 2
    image[middle - 4:middle + 4, middle - 4:middle + 4, 1] = 90
    row, col = np.clip(np.round(block).astype(int), 0, SIDE - BLOCK)
    image[row:row + BLOCK, col:col + BLOCK] = (230, 30, 30)
    return image


def away(rng: np.random.Generator) -> np.ndarray:
    """A block position off the target (its corner at least 6 pixels from the centred one)."""
    while True:
        block = rng.uniform(0, SIDE - BLOCK, 2)
        if np.abs(block - CENTRE).max() >= 6:
            return block


def write_demos(directory: Path, successes: list[bool], seed: int = 0, camera: bool = True) -> Path:
    """One episode file per label, as ``embodyrl record`` writes them."""
    rng = np.random.default_rng(seed)
    spec = OBS if camera else DictSpec.of(OBS["block"])
    for i, success in enumerate(successes):
        recorder = StepRecorder(spec, ACT, actor_id=0, device_id=0, capacity=STEPS + 1)
        blocks = [away(rng) for _ in range(STEPS + 1)]
        if success:  # on the target for the last LAST_K observations
            blocks[-LAST_K:] = [CENTRE + rng.uniform(-1, 1, 2) for _ in range(LAST_K)]
        frames = [{CAMERA: draw(rng, b), "block": b.astype(np.float32)} for b in blocks]
        frames = [f if camera else {"block": f["block"]} for f in frames]
        for t in range(STEPS):
            recorder.add(frames[t], np.zeros(2, np.float32), np.zeros(2, np.float32), 0.0, False, t == STEPS - 1,
                         PolicyVersion(0, 0))
        recorder.add_final(frames[STEPS])
        writer = DemoWriter(directory / f"episode-{i:05d}.npz", spec, ACT)
        writer.add(recorder.flush())
        writer.close(success=success, labelled_by="task")
    return directory


class Scene(Device):
    """The scene as a device: the action moves the block by up to 8 pixels a step (``camera``: False,
    the block's position alone; ``side``: a camera of another size, for its specs)."""

    def __init__(self, camera: bool = True, side: int = SIDE):
        super().__init__()
        image = ArraySpec(CAMERA, (side, side, 3), np.uint8)
        self.observation_spec = DictSpec.of(image, OBS["block"]) if camera else DictSpec.of(OBS["block"])
        self.action_spec, self.control_period_s = ACT, 0.05
        self.rng, self.block = np.random.default_rng(0), np.zeros(2)

    def _observe(self):
        observation = {CAMERA: draw(self.rng, self.block), "block": self.block.astype(np.float32)}
        return {name: observation[name] for name in self.observation_spec}

    def _connect(self):
        pass

    def _close(self):
        pass

    def _reset(self, seed):
        self.rng = np.random.default_rng(seed)
        self.block = away(self.rng)
        return self._observe()

    def _step(self, action):
        self.block = np.clip(self.block + 8.0 * np.asarray(action, np.float64), 0, SIDE - BLOCK)
        return self._observe()


def scene(camera: bool = True, side: int = SIDE) -> Scene:
    """``device.factory`` of the robot files below."""
    return Scene(camera, side)


TRAIN = ("--last-k", str(LAST_K), "--steps", "300", "--batch-size", "32", "--lr", "2e-3", "--seed", "0")
"""A tiny classifier: a few hundred steps on 24x24 frames."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``embodyrl reward train`` on 24 episodes (half successful) in two directories: (home, printed JSON)."""
    home = tmp_path_factory.mktemp("reward")
    write_demos(home / "demos_a", [True, False] * 6, seed=1)
    write_demos(home / "demos_b", [False, True] * 6, seed=2)
    proc = in_process("reward", "train", "demos_a", "demos_b", "--out", "classifier", *TRAIN, cwd=home)
    assert proc.returncode == 0, proc.stderr
    return home, json.loads(proc.stdout)


# -- labelled frames ---------------------------------------------------------------------

def test_the_last_k_frames_of_a_successful_episode_are_positive_and_the_split_is_by_episode(tmp_path):
    np.testing.assert_array_equal(last_k_labels(5, True, 2), [0, 0, 0, 0, 1, 1])  # o_0 ... o_5: o_4, o_5
    np.testing.assert_array_equal(last_k_labels(5, False, 2), [0] * 6)
    np.testing.assert_array_equal(last_k_labels(2, True, 9), [1, 1, 1])  # longer than the episode: all
    with pytest.raises(ValueError, match="last_k"):
        last_k_labels(5, True, 0)
    frames = load_frames([write_demos(tmp_path / "d", [True, False, True])], last_k=4)
    assert frames.camera_field == CAMERA and frames.images.shape == (3 * (STEPS + 1), SIDE, SIDE, 3)
    expected = np.r_[last_k_labels(STEPS, True, 4), last_k_labels(STEPS, False, 4), last_k_labels(STEPS, True, 4)]
    np.testing.assert_array_equal(frames.labels, expected)
    np.testing.assert_array_equal(frames.episodes, np.repeat([0, 1, 2], STEPS + 1))
    assert frames.counts() == {"episodes": 3, "positives": 8, "negatives": 37}
    successes = np.array([True] * 10 + [False] * 30)
    train, held = split_episodes(successes, 0.2, seed=3)
    assert not set(train) & set(held) and sorted([*train, *held]) == list(range(40))
    assert successes[held].sum() == 2 and (~successes[held]).sum() == 6  # a fifth of each outcome
    assert np.array_equal(held, split_episodes(successes, 0.2, seed=3)[1])  # seeded
    assert not np.array_equal(held, split_episodes(successes, 0.2, seed=4)[1])
    assert split_episodes(successes, 0.0, seed=3)[1].size == 0


# -- training through the command line, and the export ---------------------------------------

def test_reward_train_prints_and_saves_held_out_precision_and_recall(trained):
    home, result = trained
    for key in ("precision", "recall", "accuracy", "threshold", "threshold_from", "train", "held_out",
                "train_time_s", "camera"):
        assert key in result, key
    assert result["camera"] == CAMERA and result["threshold"] == 0.5 and result["threshold_from"] == "given"
    assert result["held_out"]["episodes"] == 4 and result["train"]["episodes"] == 20  # 2 of 12 of each outcome
    assert result["held_out"]["positives"] == 2 * LAST_K and result["train"]["positives"] == 10 * LAST_K
    assert result["held_out"]["negatives"] == 4 * (STEPS + 1) - 2 * LAST_K
    assert result["precision"] >= 0.9 and result["recall"] >= 0.9, result
    assert json.loads((home / "classifier" / "metrics.json").read_text()) == result
    classifier = load_classifier(home / "classifier")
    assert classifier.camera_field == CAMERA and classifier.threshold == 0.5
    assert classifier.input_shape == (SIDE, SIDE, 3) and classifier.metrics == result
    rng = np.random.default_rng(7)  # the numpy classifier on new frames of the scene
    on = np.stack([draw(rng, CENTRE + rng.uniform(-1, 1, 2)) for _ in range(20)])
    off = np.stack([draw(rng, away(rng)) for _ in range(20)])
    assert (classifier({CAMERA: on}) >= 0.5).mean() >= 0.9 and (classifier({CAMERA: off}) < 0.5).mean() >= 0.9
    assert isinstance(classifier({CAMERA: on[0]}), float)


def test_the_numpy_classifier_equals_the_jax_model(trained):
    """Parity: the export's graph in numpy against the JAX network with the exported weights."""
    from flax import nnx

    from embodyrl.hal import params as flat_params
    from embodyrl.reward.model import ClassifierConfig, SuccessCNN, logits

    home, _ = trained
    classifier = load_classifier(home / "classifier")
    graph = nnx.graphdef(nnx.eval_shape(lambda: SuccessCNN((SIDE, SIDE, 3), ClassifierConfig(), rngs=nnx.Rngs(0))))
    params = jax.tree_util.tree_map(jax.numpy.asarray, flat_params.unflatten(classifier.arrays))
    frames = np.random.default_rng(0).integers(0, 256, (16, SIDE, SIDE, 3), dtype=np.uint8)
    expected = np.asarray(jax.jit(lambda p, x: logits(graph, p, x))(params, frames))
    got = classifier({CAMERA: frames})
    assert got.shape == (16,) and got.min() >= 0 and got.max() <= 1
    np.testing.assert_allclose(classifier.logit({CAMERA: frames}), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-expected.astype(np.float64))), rtol=1e-5, atol=1e-6)
    assert sigmoid(np.array([-800.0, 0.0, 800.0])).tolist() == [0.0, 0.5, 1.0]  # no overflow


def test_a_malformed_export_is_refused_naming_what_is_wrong(trained, tmp_path):
    home, _ = trained
    meta = json.loads((home / "classifier" / "classifier.json").read_text())
    arrays = dict(load_classifier(home / "classifier").arrays)
    for changed, message in (({"format": "embodyrl.policy"}, "not an embodyrl.classifier v1 export"),
                             ({"threshold": 1.5}, "threshold: expected a number between 0 and 1"),
                             ({"camera_field": "camera/side"}, "expected only the camera field 'camera/side'"),
                             ({"graph": meta["graph"][:-1]}, "outputs 64 values; a classifier outputs one logit"),
                             ({"graph": [*meta["graph"], {"op": "argmax"}]}, "argmax: an op of a policy's action")):
        with pytest.raises(ClassifierError, match=message):
            SuccessClassifier({**meta, **changed}, arrays)
    with pytest.raises(ClassifierError, match="convs/1/kernel"):
        SuccessClassifier(meta, {**arrays, "convs/1/kernel": arrays["convs/1/kernel"][..., :3]})
    with pytest.raises(ClassifierError, match=r"weights lack arrays \['out/bias'\]"):
        SuccessClassifier(meta, {k: v for k, v in arrays.items() if k != "out/bias"})
    with pytest.raises(ClassifierError, match="no classifier.json"):
        load_classifier(tmp_path)
    (tmp_path / "classifier.json").write_text("{")
    (tmp_path / "classifier.npz").write_bytes(b"not a zip")
    with pytest.raises(ClassifierError, match="classifier.json: not JSON"):
        load_classifier(tmp_path)
    (tmp_path / "classifier.json").write_text(json.dumps(meta))
    with pytest.raises(ClassifierError, match="classifier.npz: not a readable array file"):
        load_classifier(tmp_path)
    np.savez(tmp_path / "classifier.npz", **arrays, bad=np.array([object()], dtype=object))
    with pytest.raises(ClassifierError, match="classifier.npz: not a readable array file"):
        load_classifier(tmp_path)  # never unpickled
    classifier = load_classifier(home / "classifier")
    with pytest.raises(KeyError, match="camera/front"):
        classifier({"block": np.zeros(2)})
    with pytest.raises(ValueError, match=r"shape \(12, 12, 3\)"):
        classifier({CAMERA: np.zeros((12, 12, 3), np.uint8)})


def test_the_classifier_loads_and_runs_without_jax(trained):
    home, _ = trained
    code = ("import sys; sys.modules['jax'] = None; sys.modules['flax'] = None; import numpy as np;"
            "from embodyrl.hal.classifier import load_classifier;"
            f"c = load_classifier({str(home / 'classifier')!r});"
            f"print(c({{{CAMERA!r}: np.zeros(({SIDE}, {SIDE}, 3), np.uint8)}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and 0 <= float(out.stdout) <= 1, out.stderr


def test_reward_train_refuses_bad_input_with_exit_2_naming_it(tmp_path, capsys):
    proc = in_process("reward", "train", "nowhere", "--out", "c", cwd=tmp_path)  # as the command line sees it
    assert proc.returncode == 2 and "embodyrl reward train: nowhere: no such directory" in proc.stderr
    assert not (tmp_path / "c").exists()
    (tmp_path / "empty").mkdir()
    write_demos(tmp_path / "blind", [True, False], camera=False)
    write_demos(tmp_path / "failures", [False, False])
    write_demos(tmp_path / "corrupt", [True, False])
    (tmp_path / "corrupt" / "episode-00001.npz").write_bytes(b"PK\x03\x04 truncated")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "classifier.json").write_text("{}")
    for args, message in ((["empty"], "empty: holds no demonstration files"),
                          (["blind"], "the demonstrations have no camera field (HxWxC uint8); their fields: block"),
                          (["failures", "--camera", "block"], "--camera 'block' is not a camera field"),
                          (["failures"], "no positive frames: none of the 2 episodes is labelled a success"),
                          (["corrupt"], "episode-00001.npz: not a readable demonstration file"),
                          (["blind", "--held-out", "1.5"], "--held-out: 1.5 is out of range")):
        demos = str(tmp_path / args[0])
        assert main(["reward", "train", demos, *args[1:], "--out", str(tmp_path / "c")]) == 2, message
        assert message in capsys.readouterr().err
    assert main(["reward", "train", str(tmp_path / "failures"), "--out", str(tmp_path / "done")]) == 2
    assert "done holds a classifier already: choose another directory" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


# -- a robot file whose reward is the classifier ---------------------------------------------

def scene_robot(home: Path, **task) -> str:
    data = {"name": "scene", "device": {"factory": "test_reward_classifier:scene"},
            "task": {"reward": "classifier:classifier", **task}, "control": {"episode_steps": 20},
            "reward_only": [CAMERA]}
    path = home / "scene.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_a_robot_file_pays_the_classifiers_verdict(trained):
    home, _ = trained
    made = robot.load(scene_robot(home, end_on_success=True))
    kind = made.layout().kinds[0]
    assert CAMERA in kind.observation_spec
    device, task = made.make()
    classifier = load_classifier(home / "classifier")
    assert task.success_reward == 1.0 and task.threshold == classifier.threshold
    with device:
        start = device.reset(seed=0)
        steps = [start]
        while not task.success(steps[-1]) and len(steps) < 10:  # steer the block onto the target
            gap = CENTRE - device.inner.block
            steps.append(device.step(np.clip(gap / 8.0, -1, 1).astype(np.float32)))
    on, off = steps[-1], start
    assert classifier(on) >= 0.5 > classifier(off)
    zero = np.zeros(2, np.float32)
    assert task.reward(off, zero, on) == 1.0 and task.terminated(on)
    assert task.reward(on, zero, off) == 0.0 and not task.terminated(off)
    assert task.episode_metrics(steps) == {"success": 1.0} and task.episode_metrics([on, off]) == {"success": 0.0}
    _, strict = robot.load(scene_robot(home, threshold=0.999999)).make()  # task.threshold overrides the export's
    assert strict.threshold == 0.999999 and not strict.terminated(on)
    assert strict.reward(off, zero, on) == float(classifier(on) >= 0.999999)


def test_a_run_records_the_classifier_and_refuses_a_changed_one(trained, tmp_path):
    import shutil

    home, _ = trained
    shutil.copytree(home / "classifier", tmp_path / "classifier")
    path = scene_robot(tmp_path)
    record = robot.load(path).record()
    json.dumps(record)
    recorded = record["files"][path]["classifier"]
    assert recorded["path"] == str((tmp_path / "classifier").resolve())
    assert set(recorded["sha256"]) == {"classifier.json", "classifier.npz"}
    config = SimpleNamespace(task=path, robot=record)
    assert robot.of_config(config).names == ("scene",)  # unchanged: rebuilt
    arrays = dict(np.load(tmp_path / "classifier" / "classifier.npz"))
    arrays["out/bias"] = arrays["out/bias"] + 1.0  # retrained, say
    np.savez(tmp_path / "classifier" / "classifier.npz", **arrays)
    with pytest.raises(robot.RobotFileError, match=r"task.reward: the classifier changed since the run started "
                                                   r"\(classifier.npz in "):
        robot.of_config(config)
    Path(path).unlink()  # the robot file is gone: rebuilt from its declaration, the classifier still checked
    with pytest.raises(robot.RobotFileError, match="the classifier changed since the run started"):
        robot.of_config(config)


def test_a_bad_classifier_reward_is_refused_naming_the_field(trained, tmp_path):
    home, _ = trained
    with pytest.raises(robot.RobotFileError, match=r"scene.yaml: task.reward: .*nowhere: no classifier.json"):
        robot.load(scene_robot(home, reward="classifier:nowhere"))
    for task, message in (({"threshold": 1.0}, "task.threshold: must be between 0 and 1, got 1.0"),
                          ({"reward": "learned"}, "task.reward: expected terms and success conditions, "
                                                  "classifier:DIR or person; got 'learned'"),
                          ({"reward": {"terms": []}, "threshold": 0.5},
                           "task.threshold: belongs to a classifier reward")):
        with pytest.raises(robot.RobotFileError, match=message):
            robot.load(scene_robot(home, **task))
    blind = yaml.safe_load(Path(scene_robot(home)).read_text())
    blind["device"]["args"] = {"camera": False}
    blind.pop("reward_only")
    (home / "blind.yaml").write_text(yaml.safe_dump(blind))
    with pytest.raises(robot.RobotFileError, match="blind.yaml: task.reward: 'camera/front' is not an observation "
                                                   "field; the robot observes block"):
        robot.load(str(home / "blind.yaml")).layout()
    blind["device"]["args"] = {"side": 32}
    (home / "blind.yaml").write_text(yaml.safe_dump(blind))
    with pytest.raises(robot.RobotFileError, match=r"blind.yaml: task.reward: the classifier reads 'camera/front' as "
                                                   r"uint8\[24, 24, 3\]; the robot's is uint8\[32, 32, 3\]"):
        robot.load(str(home / "blind.yaml")).layout()
