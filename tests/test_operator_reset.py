"""``reset: operator``: the episode's end waits for a person, whose label reaches the rows; through a
pty for ``embodyrl record`` and a real ``embodyrl actor``, and in-process for the label rules."""

import json
import os
import select
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from embodyrl import envs
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.demos import read_meta
from embodyrl.hal.operator import ScriptedOperator
from embodyrl.hal.policy import UniformRandomPolicy
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.protocol import DeviceInfo
from embodyrl.learner.testing import ServedLearner


@pytest.fixture
def learner(tmp_path):
    with ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="operator", incarnation=3,
                       peer_timeout_s=20) as served:
        yield served


def rows(batches):
    columns = {}
    for b in sorted(batches, key=lambda b: b.seq):
        for k, v in b.steps.arrays().items():
            columns.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in columns.items()}


class Sparse:
    """The pendulum task, paying for success: a label sets the last row's reward."""

    success_reward = 1.0

    def __init__(self):
        _, self.task = envs.make("pendulum")
        self.name, self.max_episode_steps = "sparse", 30

    def __getattr__(self, name):
        return getattr(self.task, name)


@pytest.mark.parametrize("task_kind", ["dense", "sparse"])
def test_the_operators_answers_label_the_last_rows(learner, task_kind):
    raw, dense = envs.make("pendulum")
    dense.max_episode_steps = 30
    task = dense if task_kind == "dense" else Sparse()
    device = SafeDevice(raw, SafetyConfig(safe_action=(0.0,)))
    operator = ScriptedOperator("sfg")
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink(learner.server.endpoint, actor_name="op", actor_id=2, devices=[info],
                       handshake_timeout_s=20, peer_timeout_s=20)
    with device, link:
        loop = ActorLoop(device, task, UniformRandomPolicy(device.action_spec, seed=0), link,
                         ActorConfig(actor_id=2, send_every=16, random_steps=10**6), operator=operator)
        stats = loop.run(max_steps=90)
        deadline = time.monotonic() + 20
        while link.unacked_rows and time.monotonic() < deadline:
            link.poll(20)
    assert [summary.split(": ")[1].split(" ended")[0] for _, summary in operator.asked] == \
        ["episode 1", "episode 2", "episode 3"]
    assert stats.labels == {"success": 1, "failure": 1, "go": 1}
    r = rows(learner.taken)
    last = np.flatnonzero(r["final"]) - 1  # each episode's last acted row
    assert r["terminated"][last].tolist() == [True, False, False]
    assert r["truncated"][last].tolist() == [False, True, True]  # go: the time limit's truncation stands
    if task_kind == "sparse":
        assert r["reward"][last[:2]].tolist() == [1.0, 0.0]  # success pays, failure does not
    assert np.isfinite(r["reward"]).all()


class Pty:
    """A process on a pseudo-terminal: its output gathered by a thread, keys typed to it."""

    def __init__(self, argv, env=None):
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     start_new_session=True)
        os.close(slave)
        self.output = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        while True:
            try:
                if select.select([self.master], [], [], 0.1)[0]:
                    data = os.read(self.master, 4096)
                    if not data:
                        return
                    self.output += data
                elif self.proc.poll() is not None:
                    return
            except OSError:  # EIO: the process closed the terminal
                return

    def wait_for(self, text: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"no {text!r} in {self.output.decode(errors='replace')[-3000:]}")
            time.sleep(0.05)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(2)
        os.close(self.master)
        return code


def test_record_asks_at_a_terminal_and_writes_the_label(tmp_path):
    (tmp_path / "expert_pty.py").write_text("def still(observation, step):\n    return None\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = tmp_path / "demos"
    term = Pty([sys.executable, "-m", "embodyrl.cli", "record", "pendulum", "--teleop", "script:expert_pty:still",
                "--episodes", "1", "--out", str(out), "--episode-steps", "40", "--time-scale", "10"], env)
    term.wait_for(b"press s (success), f (failure)", 60)
    time.sleep(0.3)  # the device holds its safe action meanwhile
    term.type(b"s")  # one key, no Enter: the terminal is in cbreak mode
    assert term.finish(60) == 0, term.output.decode(errors="replace")
    meta = read_meta(out / "episode-00000.npz")
    assert meta["success"] is True and meta["labelled_by"] == "operator"
    with np.load(out / "episode-00000.npz", allow_pickle=False) as data:
        assert data["terminated"][39] and not data["truncated"][39]


def test_a_real_actor_waits_for_the_operator_at_a_terminal(learner, tmp_path):
    term = Pty([sys.executable, "-m", "embodyrl.cli", "actor", "pendulum", "--connect", learner.server.endpoint,
                "--index", "0", "--log-dir", str(tmp_path), "--max-steps", "215",
                "--actor.reset", "operator", "--actor.time_scale", "10", "--actor.random_steps", "100000",
                "--actor.send_every", "16"])
    term.wait_for(b"episode 1 ended after 200 steps", 180)
    waited = time.monotonic()
    term.type(b"q")  # not an answer
    time.sleep(0.5)
    assert term.proc.poll() is None  # still waiting, the device held in its safe state
    term.type(b"s")
    assert term.finish(120) == 0, term.output.decode(errors="replace")
    r = rows(learner.taken)
    first = r["episode_id"] == r["episode_id"][0]
    assert first.sum() == 201 and r["final"][first][-1]
    assert r["terminated"][first][199] and not r["truncated"][first][199]  # the label reached the learner
    assert not r["terminated"][first][:199].any()
    report = json.loads((tmp_path / "actor-0.jsonl").read_text().splitlines()[-1])
    assert report["labels"] == {"success": 1} and report["operator_wait_s"] >= 0.5
    assert report["clock"]["ticks"] > 0  # a person in the loop paces the device in real time
    assert time.monotonic() - waited < 60


@pytest.mark.parametrize("reset", ["auto", "operator"])
def test_a_robot_files_reset_mode_reaches_the_actor(tmp_path, reset):
    from test_record import robot_file

    from embodyrl.cli.person import reset_mode
    from embodyrl.config import TrainConfig
    from embodyrl.robot import load

    path = str(robot_file(tmp_path, reset))
    config = TrainConfig(task=path, robot=load(path).record())
    assert reset_mode(config) == reset
