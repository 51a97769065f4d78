"""``embodyrl record`` with a scripted source (labels, the interrupted episode, the resume, the
abort) and ``embodyrl demos``; one episode recorded in-process against a task with a success signal."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.cli import main
from embodyrl.hal.demos import load_demonstrations, read_meta
from embodyrl.hal.intervention import EpisodeAborted
from embodyrl.hal.recording import record_episode
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.steps import Source
from embodyrl.hal.teleop import ScriptSource

EXPERT = '''
import os, signal
import numpy as np
from embodyrl.hal.intervention import EpisodeAborted

calls = 0
aborted = False

def push(observation, step):
    """Torque 1 on even steps, nothing on odd ones; a stop signal or an abort on request."""
    global calls, aborted
    calls += 1
    if calls == int(os.environ.get("INTERRUPT_AT", "0")):
        os.kill(os.getpid(), signal.SIGINT)
    if calls == int(os.environ.get("ABORT_AT", "0")) and not aborted:
        aborted = True
        raise EpisodeAborted("the script threw it away")
    return np.array([1.0], np.float32) if step % 2 == 0 else None
'''


@pytest.fixture
def expert(tmp_path):
    (tmp_path / "expert_rec.py").write_text(EXPERT)
    return tmp_path


def record(expert, out, episodes, answers="", **env):
    environment = {**os.environ, "PYTHONPATH": f"{expert}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   **{k: str(v) for k, v in env.items()}}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from embodyrl.cli import main; code = main(sys.argv[1:]); "
                               "assert 'jax' not in sys.modules, 'record imported JAX'; sys.exit(code)",
         "record", "pendulum", "--teleop", "script:expert_rec:push", "--episodes", str(episodes),
         "--out", str(out), "--unpaced", "--episode-steps", "50"],
        input=answers, capture_output=True, text=True, timeout=120, env=environment)


def test_record_labels_each_episode_with_the_persons_answer(expert, tmp_path):
    out = tmp_path / "demos"
    done = record(expert, out, 3, answers="s?gf s")  # ? is not an answer; g is refused: no task signal
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"episode-0000{i}.npz" for i in range(3)]
    metas = [read_meta(out / f"episode-0000{i}.npz") for i in range(3)]
    assert [m["success"] for m in metas] == [True, False, True]
    assert {m["labelled_by"] for m in metas} == {"operator"}
    assert "press s or f" in done.stderr  # the g was refused, saying why
    with np.load(out / "episode-00000.npz", allow_pickle=False) as data:
        assert data["final"].tolist() == [False] * 50 + [True]
        assert data["terminated"][49] and not data["truncated"][49]  # success: the episode ends terminal
        assert (data["source"][:50] == Source.DEMONSTRATION).all()
        assert data["action"][0, 0] == 1.0 and data["action"][1, 0] == 0.0  # odd steps held still
    with np.load(out / "episode-00001.npz", allow_pickle=False) as data:
        assert data["truncated"][49] and not data["terminated"][49]  # failure: cut short, bootstrapped
    batches = load_demonstrations(out / "episode-00000.npz")  # the loading side reads them
    assert sum(len(b) for b in batches) == 51
    assert json.loads(done.stdout)["episodes"] == 3


def test_an_interrupted_episode_is_discarded_and_the_same_command_resumes(expert, tmp_path):
    out = tmp_path / "demos"
    stopped = record(expert, out, 3, answers="sss", INTERRUPT_AT=75)  # mid second episode
    assert stopped.returncode == 130, stopped.stderr
    assert "interrupted" in stopped.stderr and "holds 1 of 3" in stopped.stderr
    assert sorted(p.name for p in out.iterdir()) == ["episode-00000.npz"]  # no partial file, no .tmp
    first = (out / "episode-00000.npz").read_bytes()
    resumed = record(expert, out, 3, answers="ff")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"episode-0000{i}.npz" for i in range(3)]
    assert (out / "episode-00000.npz").read_bytes() == first
    assert [read_meta(out / f"episode-0000{i}.npz")["success"] for i in range(3)] == [True, False, False]
    again = record(expert, out, 3)
    assert again.returncode == 0 and "nothing to do" in again.stderr


def test_an_aborted_episode_is_recorded_again(expert, tmp_path):
    out = tmp_path / "demos"
    done = record(expert, out, 2, answers="ss", ABORT_AT=60)
    assert done.returncode == 0, done.stderr
    assert "aborted (the script threw it away); discarded, recording it again" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["episode-00000.npz", "episode-00001.npz"]
    with np.load(out / "episode-00001.npz", allow_pickle=False) as data:
        assert data["step_index"][:50].tolist() == list(range(50))  # a whole episode, from its start


def test_demos_summarises_a_directory(expert, tmp_path, capsys):
    out = tmp_path / "demos"
    assert record(expert, out, 3, answers="sfs").returncode == 0
    assert main(["demos", str(out)]) == 0
    text = capsys.readouterr().out
    assert "3 episodes in 3 files" in text and "2 of 3 labelled (67%)" in text
    assert main(["demos", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 3 and summary["success_rate"] == pytest.approx(2 / 3)
    assert summary["length"] == {"mean": 50.0, "min": 50.0, "max": 50.0}
    returns = [e["return"] for e in summary["by_episode"]]
    with np.load(out / "episode-00002.npz", allow_pickle=False) as data:
        assert returns[2] == pytest.approx(float(data["reward"][:50].sum()))
    assert summary["return"]["mean"] == pytest.approx(np.mean(returns))
    (out / "broken.npz").write_bytes(b"not a zip")
    assert main(["demos", str(out)]) == 1
    assert "broken.npz" in capsys.readouterr().err
    assert main(["demos", str(tmp_path)]) == 2
    assert "no demonstration files" in capsys.readouterr().err


class NearUpright:
    """The pendulum task, with a success signal: upright at the end."""

    def __init__(self, task):
        self.task, self.name, self.max_episode_steps = task, "upright", 20

    def __getattr__(self, name):
        return getattr(self.task, name)

    def episode_metrics(self, observations):
        return {"success": bool(observations[-1]["orientation"][0] > 0.9)}


def test_the_tasks_success_signal_labels_an_episode():
    raw, task = envs.make("pendulum")
    device = SafeDevice(raw, SafetyConfig())
    upright = NearUpright(task)
    with device:
        episodes = [record_episode(device, upright, ScriptSource(lambda o, t: None, device.action_spec),
                                   seed=seed) for seed in range(6)]
    assert {e.length for e in episodes} == {20} and {e.commanded for e in episodes} == {0}
    labels = [e.task_success for e in episodes]
    assert set(labels) <= {True, False} and labels == [bool(e.steps.observation["orientation"][-1, 0] > 0.9)
                                                       for e in episodes]
    assert (episodes[0].steps.action[:20] == 0).all()  # nobody commanding: the safe action


def test_an_abort_drops_the_episode_in_process():
    raw, task = envs.make("pendulum")

    def abort(observation, step):
        if step == 3:
            raise EpisodeAborted("no")

    with raw, pytest.raises(EpisodeAborted):
        record_episode(raw, task, ScriptSource(abort, raw.action_spec), max_steps=10)


ROOT = Path(__file__).resolve().parent.parent


def robot_file(tmp_path, reset):
    text = (ROOT / "examples" / "robots" / "arm_local.yaml").read_text()
    text = text.replace("episode_steps: 250", "episode_steps: 15").replace("reset: auto", f"reset: {reset}")
    assert "episode_steps: 15" in text and f"reset: {reset}" in text
    path = tmp_path / f"arm_{reset}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("reset", ["auto", "operator"])
def test_record_a_robot_file_labels_by_its_success_conditions_or_its_operator(tmp_path, reset):
    tests = str(ROOT / "tests")
    env = {**os.environ, "PYTHONPATH": f"{tests}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = tmp_path / "demos"
    done = subprocess.run(
        [sys.executable, "-m", "embodyrl.cli", "record", str(robot_file(tmp_path, reset)), "--teleop",
         "script:robot_helpers:hold", "--episodes", "2", "--out", str(out), "--unpaced"],
        input="gs" if reset == "operator" else "", capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    metas = [read_meta(out / f"episode-0000{i}.npz") for i in range(2)]
    if reset == "auto":  # the declared success conditions label it; nobody is asked
        assert "press" not in done.stderr
        assert [m["labelled_by"] for m in metas] == ["task", "task"]
        assert [m["success"] for m in metas] == [False, False]  # holding still reaches nothing
    else:  # reset by hand: the person is asked; go keeps the task's label, s overrides it
        assert "press g (go), s (success), f (failure)" in done.stderr
        assert [(m["success"], m["labelled_by"]) for m in metas] == [(False, "task"), (True, "operator")]
    assert {m["length"] for m in metas} == {15}
