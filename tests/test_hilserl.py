"""The parts of the LeRobot HIL-SERL side-by-side experiment that run without its own environment: the
scripted expert and person (pure numpy), the per-episode log both systems write, ``gym:MODULE:ID``,
a Gymnasium env's own success signal, LeRobot's config as the experiment writes it, and the curve and
resource accounting. The experiment itself needs gym-hil (mujoco below 3.9) and LeRobot (torch below
2.11): ``examples/hilserl_side_by_side.py`` makes that environment, and the slow test at the end runs
its quick plan where ``EMBODYRL_HILSERL_VENV`` names one already made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest

from embodyrl import envs
from embodyrl.envs import panda_pick as pp
from embodyrl.hal.drivers import gymnasium as gym_driver

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import hilserl_side_by_side as side_by_side  # noqa: E402

CUBE = np.array([0.5, 0.0, 0.02])


def observation(tcp, cube=CUBE, gripper=0.0) -> dict:
    state = np.zeros(18, np.float32)
    state[pp.GRIP] = gripper
    state[pp.TCP] = tcp
    return {"state": state, "environment_state": np.asarray(cube, np.float32)}


def test_the_expert_comes_in_above_the_cube_closes_on_it_waits_for_the_fingers_and_lifts():
    expert = pp.Expert()
    far = expert(observation([0.3, 0.0, 0.3]), 0)
    assert far[0] == 1.0 and far[2] == -1.0 and far[3] == pp.HOLD  # toward the hover point, full step
    above = expert(observation([0.5, 0.03, 0.07]), 1)
    assert above[1] < 0 and above[2] == pytest.approx(0.0, abs=1e-5)  # aligns at hover height first
    assert expert(observation([0.5, 0.0, 0.07]), 2)[2] < 0  # aligned: down to the cube
    assert expert(observation(CUBE), 3)[3] == pp.CLOSE
    closed = observation(CUBE, gripper=255.0)
    waits = [expert(closed, 4 + k) for k in range(expert.settle_steps - 1)]
    assert all(a[3] == pp.HOLD and not a[:3].any() for a in waits)
    assert expert(closed, 10)[2] == 1.0  # lifts
    lost = observation([0.5, 0.0, 0.2], gripper=255.0)  # lifted, the cube left on the table
    assert expert(lost, 11)[3] == pp.OPEN
    assert expert(observation([0.3, 0.0, 0.3]), 0)[3] == pp.HOLD  # step 0: a new episode


def test_the_person_lets_a_policy_approach_and_takes_over_when_it_drifts_for_at_least_its_hold():
    person = pp.Person()
    path = [[0.3, 0.0, 0.3], [0.35, 0.0, 0.25], [0.4, 0.0, 0.2]]
    assert all(person(observation(tcp), step) is None for step, tcp in enumerate(path))
    assert person.interventions == 0
    drifted = observation([0.3, 0.0, 0.35])  # 10 cm further than the closest it came
    acts = [person(drifted, 3 + k) for k in range(person.corridor.hold_steps)]
    assert all(a is not None for a in acts) and person.interventions == person.corridor.hold_steps
    assert person(drifted, 20) is not None  # still out of the corridor: keeps control
    person(observation([0.3, 0.0, 0.3]), 0)  # a new episode clears the state
    assert person(observation([0.32, 0.0, 0.3]), 1) is None


def test_the_person_takes_over_a_policy_that_pushes_the_cube_or_stalls_short_of_it():
    person = pp.Person()
    person(observation([0.45, 0.0, 0.05]), 0)
    assert person(observation([0.5, 0.0, 0.03], cube=[0.54, 0.0, 0.02]), 1) is not None  # pushed 4 cm
    stalling = pp.Person()
    stops = [stalling(observation([0.4, 0.0, 0.2]), step) for step in range(stalling.corridor.stall_steps + 2)]
    assert stops[0] is None and stops[-1] is not None


def test_the_episode_log_counts_on_from_its_file_and_writes_an_episode_the_time_limit_cut(tmp_path):
    path = tmp_path / "episodes.jsonl"
    log = pp.EpisodeLog(path)
    log.start()
    for reward in (0.0, 0.0, 1.0):
        log.step(reward, ended=reward >= 1.0)
    log.start()
    log.step(0.0, ended=False)
    log.end()  # a reset after a truncation outside the wrapper
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["steps"], r["episode_steps"], r["success"]) for r in rows] == [(3, 3, True), (4, 1, False)]
    assert pp.EpisodeLog(path).steps == 4  # a restarted process goes on counting


def test_gym_module_colon_id_imports_the_module_that_registers_it():
    assert envs.is_known(f"gym:embodyrl.envs.panda_pick:{pp.ENV_ID}")
    assert not envs.is_known("gym:embodyrl.no_such_module:Nothing-v0")
    assert "unknown Gymnasium id" in envs.unknown_reason("gym:embodyrl.no_such_module:Nothing-v0")


def test_a_gymnasium_env_that_reports_is_success_labels_its_episodes():
    class Says(gymnasium.Wrapper):
        def step(self, action):
            o, r, terminated, truncated, info = self.env.step(action)
            return o, r, terminated, truncated, {**info, "is_success": True}

    device = gym_driver.GymDevice(Says(gymnasium.make("Pendulum-v1")))
    task = gym_driver.GymTask(device)
    with device:
        device.reset(seed=0)
        assert task.episode_metrics([]) == {}  # nothing said yet
        device.step(np.zeros(1, np.float32))
        assert task.episode_metrics([]) == {"success": 1.0}
    plain = gym_driver.GymDevice(gymnasium.make("Pendulum-v1"))
    with plain:
        plain.reset(seed=0)
        plain.step(np.zeros(1, np.float32))
        assert gym_driver.GymTask(plain).episode_metrics([]) == {}


def test_lerobots_config_names_the_same_features_and_settings_and_one_directory_a_process(tmp_path):
    plan = side_by_side.Plan()
    bounds = {"state": {"min": [0.0] * 18, "max": [1.0] * 18},
              "environment_state": {"min": [0.0] * 3, "max": [1.0] * 3}}
    paths = {who: side_by_side.lerobot_config(tmp_path, who, 3, plan, bounds, tmp_path / "demos")
             for who in ("learner", "actor")}
    learner, actor = (json.loads(paths[who].read_text()) for who in ("learner", "actor"))
    assert learner["output_dir"] != actor["output_dir"]
    assert {k: v for k, v in learner.items() if k != "output_dir"} == {k: v for k, v in actor.items()
                                                                       if k != "output_dir"}
    policy = learner["policy"]
    assert set(policy["input_features"]) == {"observation.state", "observation.environment_state"}
    assert policy["num_discrete_actions"] == 3 and policy["online_steps"] == plan.steps
    assert (policy["discount"], policy["temperature_init"]) == (plan.discount, plan.temperature)
    assert learner["env"]["task"] == side_by_side.LEROBOT_TASK and learner["seed"] == 3
    assert learner["dataset"]["root"] == str(tmp_path / "demos")
    settings = side_by_side.embodyrl_settings(plan)
    assert settings[settings.index("--sac.discount") + 1] == str(plan.discount)


def test_the_curve_scores_success_without_help_and_the_persons_share_by_window():
    rows = [{"wall": 100.0 + k, "steps": 10 * (k + 1), "episode_steps": 10, "success": k % 2 == 0,
             "person_steps": 0 if k < 2 else 5} for k in range(4)]
    points = side_by_side.curve(rows, started=100.0, window=2)
    assert points == [{"steps": 20, "wall_s": 1.0, "unaided_success": 0.5, "person_share": 0.0},
                      {"steps": 40, "wall_s": 3.0, "unaided_success": 0.0, "person_share": 0.5}]
    tail = side_by_side.curve(rows[:3], started=100.0, window=2)  # the last window covers the end
    assert [p["steps"] for p in tail] == [20, 30] and tail[-1]["unaided_success"] == 0.0


def test_a_processs_cpu_and_peak_memory_come_from_wait4_and_a_late_one_is_killed():
    burn = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.3: pass"])
    usage = side_by_side.waited(burn)
    assert usage["exit"] == 0 and usage["cpu_s"] >= 0.3 and usage["peak_mb"] > 1
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert side_by_side.waited(sleeper, timeout_s=0.5)["exit"] == -9


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("EMBODYRL_HILSERL_VENV"),
                    reason="needs the experiment's environment (torch, LeRobot, gym-hil): "
                           "EMBODYRL_HILSERL_VENV=DIR, made by examples/hilserl_side_by_side.py")
def test_the_quick_plan_runs_both_systems_and_every_fault(tmp_path):
    venv = os.environ["EMBODYRL_HILSERL_VENV"]
    for script in ("hilserl_side_by_side.py", "hilserl_faults.py"):
        subprocess.run([sys.executable, str(ROOT / "examples" / script), "--root", str(tmp_path), "--venv", venv,
                        "--quick"], check=True, timeout=1800)
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert set(progress) == {"embodyrl/seed0", "lerobot/seed0"}
    assert all(run["curve"] for run in progress.values())
    faults = json.loads((tmp_path / "faults.json").read_text())
    assert set(faults) == {"embodyrl", "lerobot"}
    assert faults["embodyrl"]["rows_lost"] == 0


def test_the_tables_put_the_systems_side_by_side_and_name_every_fault():
    sides = {side: {"seeds": 3, "final_unaided_success": 0.5, "final_unaided_success_by_seed": [0.5, 0.4, 0.6],
                    "final_person_share_by_seed": [0.1, None, 0.2], "wall_s": 600.0, "cpu_s": 900.0,
                    "peak_mb_largest_process": 1500.0, "updates_by_seed": [20_000, None, 5],
                    "best_window_by_seed": [0.5, 0.4, 0.6], "steps_to_half_by_seed": [900, None, 1000]}
             for side in side_by_side.SIDES}
    summary = {"sides": sides, "reach_lerobot_final": {"level": 0.5, "embodyrl": {"steps": [100, None, 200],
                                                                                   "wall_s": [10.4, None, 20.6]},
                                                         "lerobot": {"steps": [300, 400, None],
                                                                     "wall_s": [30.0, 40.0, None]}}}
    faults = {side: {"faults": {"actor_sigkill": {"recover_s": 1.5}}, "steps_taken": 10, "rows_held_at_end": 9,
                     "rows_lost": 1} for side in ("embodyrl", "lerobot")}
    text = side_by_side.table(summary, faults)
    assert "| success without help, last window (mean) | 0.50 | 0.50 |" in text
    assert "0.10 / - / 0.20" in text and "[10, None, 21]" in text
    assert '| `actor_sigkill` | {"recover_s": 1.5} | {"recover_s": 1.5} |' in text
    assert "| rows_lost | 1 | 1 |" in text and "20,000 / - / 5" in text and "900 / never / 1,000" in text
