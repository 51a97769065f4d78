"""Training from a dataset LeRobot's own writer made, against training without it.

A person's demonstrations kept as a LeRobotDataset (here: the scripted leader arm of
``embodyrl.envs.lerobot_arm`` driving the simulated follower, written frame by frame with LeRobot's
``LeRobotDataset.create`` / ``add_frame`` / ``save_episode``, as ``lerobot-record`` writes them) are
given to ``embodyrl train examples/robots/lerobot_sim_arm.yaml --demos DATASET`` as they are, no
conversion; the same runs without them are the baseline. Each run's directory is kept; the command
resumes (a run with a summary is not run again) and writes ``results.json`` and the curves with
every run's artifacts.

Needs LeRobot (``pip install 'embodyrl[lerobot]'``: it brings torch) and the learner::

    python examples/lerobot_dataset_training.py --out results/lerobot_dataset
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ROBOT = ROOT / "examples" / "robots" / "lerobot_sim_arm.yaml"


def write_dataset(root: Path, episodes: int, seed: int = 0) -> None:
    """The leader's episodes through LeRobot's own writer: state, action, next.reward, next.done and
    next.truncated (the pose task ends on its time limit), 100 frames at 50 fps each."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from embodyrl.envs.lerobot_arm import HOME, NAMES, PoseTask, ScriptedLeader, SimulatedFollower

    vector = {"dtype": "float32", "shape": (len(NAMES),), "names": list(NAMES)}
    flag = {"dtype": "bool", "shape": (1,), "names": None}
    features = {"observation.state": vector, "action": vector, "next.done": flag, "next.truncated": flag,
                "next.reward": {"dtype": "float32", "shape": (1,), "names": None}}
    shutil.rmtree(root, ignore_errors=True)
    dataset = LeRobotDataset.create(repo_id="local/sim_leader", fps=50, features=features, root=root,
                                    use_videos=False)
    arm, task, rng = SimulatedFollower(), PoseTask(), np.random.default_rng(seed)
    arm.connect()
    for _ in range(episodes):
        leader = ScriptedLeader(rest_polls=0, move_polls=int(rng.integers(10, 40)), hold_polls=1000)
        leader.connect()
        start = {n: HOME[n] + float(rng.normal(0, 3)) for n in NAMES}
        for _ in range(20):  # near home, as the robot file's reset leaves the arm
            arm.send_action(start)
        observed = arm.get_observation()
        for t in range(task.max_episode_steps):
            action = leader.get_action()
            state = np.array([observed[n] for n in NAMES], np.float32)
            arm.send_action(action)
            observed = arm.get_observation()
            reward = task.reward(None, None, {"state": np.array([observed[n] for n in NAMES])})
            last = t == task.max_episode_steps - 1
            dataset.add_frame({"observation.state": state, "action": np.array([action[n] for n in NAMES], np.float32),
                               "next.reward": np.array([reward], np.float32), "next.done": np.array([last]),
                               "next.truncated": np.array([last]), "task": "reach the pose"})
        dataset.save_episode()
    dataset.finalize()
    arm.disconnect()


def train(out: Path, name: str, seed: int, steps: int, demos: Path | None) -> dict:
    run = out / "runs" / f"{name}-s{seed}"
    if not (run / "summary.json").is_file():
        shutil.rmtree(run, ignore_errors=True)
        command = [sys.executable, "-m", "embodyrl.cli", "train", str(ROBOT), "--algorithm", "sac", "--run-dir",
                   str(run), "--steps", str(steps), "--seed", str(seed), "--eval_episodes", "5",
                   "--learner.min_replay", str(min(500, steps // 2)), "--actor.random_steps",
                   str(min(500, steps // 2)), "--quiet", *(["--demos", str(demos)] if demos else [])]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads((run / "summary.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/lerobot_dataset"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--episodes", type=int, default=10, help="demonstration episodes in the dataset")
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 episodes, 300 steps (a check)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.episodes = 1, 300, 2
    out = args.out.resolve()
    dataset = out / "sim_leader"
    if not (dataset / "meta" / "info.json").is_file():
        write_dataset(dataset, args.episodes)
    results = {}
    for name, demos in (("dataset", dataset), ("scratch", None)):
        summaries = [train(out, name, seed, args.steps, demos) for seed in range(args.seeds)]
        results[name] = {key: [s[key] for s in summaries] for key in
                         ("eval_return_mean", "eval_final_error_deg", "eval_success", "random_return_mean", "wall_s")}
        results[name]["mean_eval_return"] = float(np.mean(results[name]["eval_return_mean"]))
    results.update(steps=args.steps, seeds=args.seeds, episodes=args.episodes)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    subprocess.run([sys.executable, "-m", "embodyrl.cli", "plot", *sorted(map(str, (out / "runs").iterdir())),
                    "--out", str(out / "curves.png"), "--keep-artifacts"], capture_output=True, check=False)
    print(json.dumps({name: results[name]["mean_eval_return"] for name in ("dataset", "scratch")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
