"""A person in the loop when the learner dies (the actor goes on: the teleop drives, rows spool, a
device with no weights holds safe, the screen says so), and the intervention rate of a real run."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from test_actor_outage import connected_link

from embodyrl import envs
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.intervention import ScriptedIntervention
from embodyrl.hal.policy import UniformRandomPolicy
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.steps import NO_POLICY, PolicyVersion
from embodyrl.hal.wire.spool import Spool
from embodyrl.learner.testing import ServedLearner

SAFE = -0.25


class Constant(UniformRandomPolicy):
    """Torque 0.5, with or without weights."""

    def __init__(self, spec, version):
        super().__init__(spec)
        self.version = version

    def act(self, observation, *, explore=True):
        return np.array([0.5], np.float32), {}


def run_without_learner(version, tmp_path, steps=120):
    link = connected_link(Spool(), tmp_path, peer_timeout_s=5)
    deadline = time.monotonic() + 5
    while link.connected and time.monotonic() < deadline:  # the learner's socket closed: the link sees it
        link.poll(20)
    raw, task = envs.make("pendulum")
    device = SafeDevice(raw, SafetyConfig(safe_action=(SAFE,)))
    person = ScriptedIntervention(rule=lambda t, o: np.array([1.5], np.float32) if 40 <= t < 80 else None)
    loop = ActorLoop(device, task, Constant(device.action_spec, version), link,
                     ActorConfig(send_every=16, random_steps=0, realtime=True, time_scale=10),
                     intervention=person)
    applied = []
    with device:
        original = device.step
        device.step = lambda a: applied.append(float(np.asarray(a)[0])) or original(a)
        start = time.monotonic()
        stats = loop.run(max_steps=steps)
        elapsed = time.monotonic() - start
    return stats, link, applied, elapsed, device


def test_no_weights_and_no_learner_the_device_holds_safe_while_the_person_drives(tmp_path):
    stats, link, applied, elapsed, device = run_without_learner(NO_POLICY, tmp_path)
    assert elapsed < 120 * 0.005 * 3 + 2, "the loop waited on the dead learner"
    assert stats.learner == "gone"
    assert stats.interventions == 40 and stats.env_steps == 40  # only the person's steps acted
    assert stats.held_steps == 80
    assert applied[:40] == [SAFE] * 40 and applied[40:80] == [1.5] * 40 and applied[80:] == [SAFE] * 40
    assert link.spool.rows == 40  # the person's steps wait for the learner; held periods are not rows
    assert np.array_equal(device.last_applied, [SAFE])


def test_with_weights_the_policy_acts_on_and_everything_spools(tmp_path):
    stats, link, applied, _, _ = run_without_learner(PolicyVersion(7, 3), tmp_path)
    assert stats.learner == "gone" and stats.held_steps == 0
    assert stats.env_steps == 120 and stats.interventions == 40
    assert applied[:40] == [0.5] * 40 and applied[40:80] == [1.5] * 40
    assert link.spool.rows == 120


EXPERT = '''
import numpy as np

def every_other(observation, step):
    return np.array([1.0], np.float32) if step % 2 == 0 else None

calls = 0

def blocks(observation, step):
    """The person drives 50 periods of every 100."""
    global calls
    calls += 1
    return np.array([1.0], np.float32) if (calls // 50) % 2 else None
'''


@pytest.fixture
def expert(tmp_path):
    (tmp_path / "expert_out.py").write_text(EXPERT)
    return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_a_real_actor_goes_on_when_its_learner_dies_during_teleoperation(tmp_path, expert):
    learner = ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="dying", incarnation=5,
                            peer_timeout_s=20)  # takes, commits and acknowledges rows; publishes no weights
    log = tmp_path / "actor-0.jsonl"
    actor = subprocess.Popen(
        [sys.executable, "-m", "embodyrl.cli", "actor", "pendulum", "--connect", learner.endpoint,
         "--log-dir", str(tmp_path), "--max-steps", "1400", "--teleop", "script:expert_out:blocks",
         "--actor.realtime", "true",  # a robot's pace: a script person no longer implies it
         "--actor.time_scale", "10", "--actor.random_steps", "0", "--actor.send_every", "16",
         "--actor.spool_dir", str(tmp_path / "spool"), "--actor.flush_timeout_s", "1",
         "--learner.peer_timeout_s", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=expert)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and actor.poll() is None:
            lines = log.read_text().splitlines() if log.exists() else []
            if lines and json.loads(lines[-1])["env_steps"] >= 200:
                break
            time.sleep(0.1)
        delivered = learner.rows
    finally:
        learner.kill()  # the learner dies: no BYE
    out, err = actor.communicate(timeout=120)
    assert actor.returncode == 1, err[-3000:]  # its spool never delivered: it says so
    assert "the learner is gone; no weights yet: the devices hold their safe state" in err
    assert "unacknowledged" in err and str(tmp_path / "spool") in err
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["learner"] == "gone" and last["held_steps"] > 100  # held safe outside the person's blocks
    assert last["interventions"] >= 200  # the person went on driving
    assert last["env_steps"] + last["held_steps"] == 1400
    assert last["link"]["spool_rows"] > 100  # the person's rows wait for a learner
    assert delivered > 0


def test_the_intervention_rate_of_a_real_run_reaches_metrics(tmp_path, expert):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "embodyrl.cli", "train", "pendulum", "--steps", "600", "--run-dir", str(run_dir),
         "--teleop", "script:expert_out:every_other", "--actor.time_scale", "20", "--eval_episodes", "1",
         "--learner.min_replay", "200", "--actor.random_steps", "1000", "--quiet"],
        capture_output=True, text=True, timeout=600, env=expert)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["intervention_rate"] for r in records if r.get("intervention_rate") is not None]
    assert rates and all(rate == pytest.approx(0.5) for rate in rates)  # 100 of each 200-step episode
    assert json.loads((run_dir / "config.json").read_text())["actor"]["teleop"] == "script:expert_out:every_other"
