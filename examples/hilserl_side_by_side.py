"""LeRobot's HIL-SERL and embodyrl on gym-hil's PandaPickCube, side by side: the same task, demonstrations,
scripted person and step budget, 3 seeds a side; then the same faults on both.

Everything runs in an environment of the experiment's own (``--venv``, made on first use: gym-hil needs
mujoco below 3.9 and LeRobot 0.4.4 torch below 2.11, neither of which the project's own install has):
torch 2.9.1 (CPU), ``lerobot==0.4.4``, ``gym-hil==0.1.14``, LeRobot's gRPC pins, and this checkout with
its ``learner`` and ``gym`` extras. ::

    python examples/hilserl_side_by_side.py --root runs/hilserl           # the whole plan, resumable
    python examples/hilserl_side_by_side.py --root runs/hilserl --quick   # one seed, 300 steps a side

The task (:mod:`embodyrl.envs.panda_pick`): gym-hil's PandaPickCube with state observations (21 numbers),
gym-hil's end-effector action (xyz and the gripper), 100-step episodes at 10 Hz, the sparse lift reward.

* Demonstrations: the scripted expert's episodes, recorded once with ``embodyrl record --format lerobot``
  (a LeRobotDataset v3.0): LeRobot's learner reads them as its offline dataset, embodyrl's as ``--demos``.
* The person: :data:`embodyrl.envs.panda_pick.person` (the same function on both sides): through
  ``--teleop`` on embodyrl's side and gym-hil's intervention signals on LeRobot's
  (``examples/hilserl_lerobot_actor.py``).
* The measure: one JSON line per episode written by the same wrapper on both sides
  (:class:`embodyrl.envs.panda_pick.EpisodeLog`): success without help (the episode succeeded and the
  person never acted) against environment steps and wall clock, and the person's share of steps.
  CPU seconds and peak memory of each process come from ``wait4``.
* LeRobot's side: ``lerobot.rl.learner`` and the actor, unchanged, from a config written here
  (:func:`lerobot_config`: SAC with its discrete gripper critic, the offline dataset mixed in as LeRobot
  does, the settings below where both systems have one). embodyrl's side: ``embodyrl train`` with RLPD,
  the default of its person-in-the-loop experiment.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from embodyrl.envs import panda_pick

REPO = Path(__file__).resolve().parent.parent
TASK = f"gym:{panda_pick.__name__}:{panda_pick.ENV_ID}"
EXPERT = f"script:{panda_pick.__name__}:expert"
PERSON = f"script:{panda_pick.__name__}:person"
LEROBOT_TASK = "PandaPickCubeScripted-v0"
"""The gym-hil id LeRobot's actor makes (``gym_hil/`` + this; ``hilserl_lerobot_actor.py`` registers it)."""
VERSIONS = {"torch": "2.9.1", "lerobot": "0.4.4", "gym-hil": "0.1.14", "grpcio": "1.73.1"}
SIDES = ("embodyrl", "lerobot")


@dataclass(frozen=True)
class Plan:
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 10_000
    """Environment steps a run (both sides)."""
    demos: int = 10
    discount: float = 0.97
    temperature: float = 0.1
    batch: int = 256
    learning_starts: int = 300
    """Environment steps before the first update (embodyrl: random actions until then too)."""
    save_every: int = 500
    """LeRobot's learner checkpoints (and rewrites its replay) every this many updates."""
    port: int = 50061
    window: int = 20
    """Episodes per point of the success curve."""
    lerobot_fps: int = 1000
    """LeRobot's actor paces itself to ``env.fps``: 1000 leaves it unpaced, as embodyrl's actor is
    against a simulator; 10 is gym-hil's control rate, the pace of LeRobot's own sim guide."""

    @classmethod
    def quick(cls) -> Plan:
        return cls(seeds=(0,), steps=300, demos=2, learning_starts=100, save_every=100, port=50062, window=3)


def venv_python(venv: Path) -> Path:
    """The experiment's environment, made on first use; its python."""
    python = venv / "bin" / "python"
    done = venv / ".embodyrl-hilserl"
    if done.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, f"torch=={VERSIONS['torch']}", "torchvision==0.24.1"], check=True)
    # lerobot[hilserl] also pins placo (inverse kinematics for real arms), whose meshcat dependency does
    # not build here; the rest of that extra is what the simulated path uses
    subprocess.run([*pip, f"lerobot=={VERSIONS['lerobot']}", f"gym-hil=={VERSIONS['gym-hil']}",
                    f"grpcio=={VERSIONS['grpcio']}", "protobuf>=6.31.1,<6.32.0"], check=True)
    subprocess.run([*pip, "-e", f"{REPO}[learner,gym]"], check=True)
    done.write_text(json.dumps(VERSIONS))
    return python


def environ(episodes: Path | None = None, step_count: Path | None = None) -> dict:
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "HF_HUB_OFFLINE": "1",
           "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    if episodes is not None:
        env[panda_pick.EPISODE_LOG] = str(episodes)
    if step_count is not None:
        env[panda_pick.STEP_COUNT] = str(step_count)
    return env


def record_demos(python: Path, root: Path, plan: Plan) -> Path:
    out = root / "demos"
    if not (out / "meta" / "info.json").exists() or json.loads((out / "meta" / "info.json").read_text())[
            "total_episodes"] < plan.demos:
        subprocess.run([str(python), "-m", "embodyrl.cli", "record", TASK, "--teleop", EXPERT, "--episodes",
                        str(plan.demos), "--out", str(out), "--format", "lerobot", "--unpaced"],
                       check=True, env=environ(), cwd=root, capture_output=True)
    return out


def observation_bounds(python: Path) -> dict:
    """Min and max of each feature over episodes of uniform random actions with the person (LeRobot's
    SAC normalises states and actions to [-1, 1] by given bounds; embodyrl's learner needs none)."""
    code = """
import json, gymnasium, numpy as np
import embodyrl.envs.panda_pick as pp
env = gymnasium.make(pp.ENV_ID); env.action_space.seed(0); seen = {"state": [], "environment_state": []}
for episode in range(10):
    obs, _ = env.reset(seed=episode)
    for step in range(100):
        for key in seen: seen[key].append(obs[key])
        action = pp.person(obs, step)
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample() if action is None else action)
        if terminated or truncated: break
out = {}
for key, values in seen.items():
    values = np.asarray(values, np.float64); low, high = values.min(0), values.max(0); pad = 0.1 * (high - low) + 1e-3
    out[key] = {"min": (low - pad).tolist(), "max": (high + pad).tolist()}
print(json.dumps(out))
"""
    proc = subprocess.run([str(python), "-c", code], check=True, env=environ(), capture_output=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def lerobot_config(run: Path, who: str, seed: int, plan: Plan, bounds: dict, demos: Path) -> Path:
    """LeRobot's HIL-SERL config for this run's learner or actor (``who``; the same but for the output
    directory), written from LeRobot 0.4.4's config classes (its shipped configs live on the Hugging
    Face Hub, which is not reachable here)."""
    features = {"observation.state": {"type": "STATE", "shape": [18]},
                "observation.environment_state": {"type": "ENV", "shape": [3]}}
    action = {"action": {"type": "ACTION", "shape": [3]}}
    stats = {"observation.state": bounds["state"], "observation.environment_state": bounds["environment_state"],
             "action": {"min": [-1.0, -1.0, -1.0], "max": [1.0, 1.0, 1.0]}}
    config = {
        "output_dir": str(run / who), "job_name": f"pick-{seed}", "resume": False, "seed": seed,
        "batch_size": plan.batch, "steps": 10**9, "log_freq": 100, "save_checkpoint": True,
        "save_freq": plan.save_every, "num_workers": 0, "wandb": {"enable": False},
        "dataset": {"repo_id": "local/panda_pick_demos", "root": str(demos), "use_imagenet_stats": False},
        "env": {"type": "gym_manipulator", "name": "gym_hil", "task": LEROBOT_TASK, "fps": plan.lerobot_fps,
                "features": {**features, **action}, "features_map": {key: key for key in {**features, **action}},
                "processor": {"control_mode": "gamepad",
                              "gripper": {"use_gripper": True, "gripper_penalty": panda_pick.GRIPPER_PENALTY}}},
        "policy": {
            "type": "sac", "device": "cpu", "storage_device": "cpu", "use_torch_compile": False,
            "push_to_hub": False,
            "input_features": features, "output_features": action,
            "dataset_stats": stats, "num_discrete_actions": 3,
            "online_steps": plan.steps, "online_step_before_learning": plan.learning_starts,
            "discount": plan.discount, "temperature_init": plan.temperature,
            "online_buffer_capacity": plan.steps + 1000, "offline_buffer_capacity": 100_000,
            "actor_learner_config": {"learner_host": "127.0.0.1", "learner_port": plan.port},
            "concurrency": {"actor": "threads", "learner": "threads"},
        },
    }
    path = run / f"{who}.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def waited(proc: subprocess.Popen, timeout_s: float | None = None) -> dict:
    """Wait for ``proc`` (SIGKILL after ``timeout_s``): its exit status, CPU seconds and peak memory (MB),
    from wait4."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG if deadline else 0)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            deadline = None
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"exit": proc.returncode, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}


def niced(command: list[str]) -> list[str]:
    return ["nice", "-n", "5", *command]


def embodyrl_settings(plan: Plan) -> list[str]:
    """embodyrl's side: RLPD as its person-in-the-loop experiment runs it, the shared settings, and
    LayerNorm in the actor (as SERL's networks have): gym-hil's state holds the gripper command in
    0..255 unscaled, which saturated the plain actor's tanh (entropy near -10 against a target of -2,
    the temperature growing without end, no success in 10k steps)."""
    return ["--algorithm", "rlpd", "--learner.updates_per_step", "2", "--learner.n_step", "3",
            "--sac.discount", str(plan.discount), "--sac.init_temperature", str(plan.temperature),
            "--sac.actor_layer_norm", "true",
            "--actor.random_steps", str(plan.learning_starts), "--learner.min_replay", str(plan.learning_starts)]


def run_embodyrl(python: Path, root: Path, seed: int, plan: Plan) -> dict:
    run = root / "embodyrl" / f"seed{seed}"
    run.parent.mkdir(parents=True, exist_ok=True)
    episodes = run.parent / f"seed{seed}.episodes.jsonl"
    command = [str(python), "-m", "embodyrl.cli", "train", TASK, "--demos", str(root / "demos"), "--teleop",
               PERSON, "--steps", str(plan.steps), "--seed", str(seed), "--run-dir", str(run), "--quiet",
               "--eval_episodes", "0", *embodyrl_settings(plan)]
    with (run.parent / f"seed{seed}.log").open("w") as log:
        started = time.time()
        proc = subprocess.Popen(niced(command), env=environ(episodes), cwd=root, stdout=log, stderr=log)
        usage = waited(proc)
    return {"side": "embodyrl", "seed": seed, "started": started, "wall_s": time.time() - started,
            "processes": {"train": usage}, "episodes": str(episodes.relative_to(root))}


def run_lerobot(python: Path, root: Path, seed: int, plan: Plan, bounds: dict) -> dict:
    run = root / "lerobot" / f"seed{seed}"
    run.mkdir(parents=True, exist_ok=True)
    config = {who: lerobot_config(run, who, seed, plan, bounds, root / "demos") for who in ("learner", "actor")}
    episodes = run.parent / f"seed{seed}.episodes.jsonl"
    logs = {name: (run / f"{name}.log").open("w") for name in ("learner", "actor")}
    started = time.time()
    learner = subprocess.Popen(niced([str(python), "-m", "lerobot.rl.learner", "--config_path", str(config["learner"])]),
                               env=environ(), cwd=run, stdout=logs["learner"], stderr=subprocess.STDOUT)
    actor = subprocess.Popen(niced([str(python), str(REPO / "examples" / "hilserl_lerobot_actor.py"),
                                    "--config_path", str(config["actor"])]),
                             env=environ(episodes), cwd=run, stdout=logs["actor"], stderr=subprocess.STDOUT)
    actor_usage = waited(actor)
    learner.send_signal(signal.SIGINT)  # the actor is done: LeRobot's learner runs until told to stop
    learner_usage = waited(learner, timeout_s=120)
    return {"side": "lerobot", "seed": seed, "started": started, "wall_s": time.time() - started,
            "processes": {"learner": learner_usage, "actor": actor_usage},
            "episodes": str(episodes.relative_to(root))}


def load_episodes(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def curve(rows: list[dict], started: float, window: int) -> list[dict]:
    """Per window of episodes: steps and seconds at its end, success without help, the person's share;
    the last point is the run's last ``window`` episodes (overlapping the one before it where the
    episodes do not divide evenly), so every run's final point covers its end."""
    points = []
    ends = list(range(window, len(rows) + 1, window))
    if ends and ends[-1] != len(rows):
        ends.append(len(rows))
    for end in ends:
        chunk = rows[end - window:end]
        steps = sum(r["episode_steps"] for r in chunk)
        points.append({"steps": chunk[-1]["steps"], "wall_s": chunk[-1]["wall"] - started,
                       "unaided_success": sum(r["success"] and r["person_steps"] == 0 for r in chunk) / window,
                       "person_share": sum(r["person_steps"] for r in chunk) / steps})
    return points


def on_grid(points: list[dict], key: str, grid, x: str = "steps"):
    """``key`` of a run's curve at each ``grid`` value of ``x`` (the latest point at or before it)."""
    import numpy as np

    xs = np.array([p[x] for p in points])
    ys = np.array([p[key] for p in points])
    return np.array([ys[xs <= g][-1] if (xs <= g).any() else np.nan for g in grid])


def first_reaching(points: list[dict], level: float, x: str) -> float | None:
    return next((p[x] for p in points if p["unaided_success"] >= level), None)


def updates_of(root: Path, side: str, seed: int) -> int | None:
    """Gradient updates a run made, from each system's own record: embodyrl's last metrics line,
    LeRobot's last "Number of optimization step" log line (it logs every ``log_freq``)."""
    run = root / side / f"seed{seed}"
    if side == "embodyrl":
        lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
        return json.loads(lines[-1]).get("updates") if lines else None
    log = run / "learner.log"
    said = [line for line in log.read_text(errors="replace").splitlines()
            if "Number of optimization step:" in line] if log.exists() else []
    return int(said[-1].rsplit(":", 1)[1]) if said else None


def summarise(progress: dict, plan: Plan, root: Path | None = None) -> dict:
    """Per side: the final success without help (mean of each seed's last window), the person's share,
    resources; and steps and seconds for each embodyrl seed to reach LeRobot's final level."""
    import numpy as np

    out = {"plan": asdict(plan), "versions": VERSIONS, "sides": {}}
    for side in SIDES:
        runs = [progress[f"{side}/seed{seed}"] for seed in plan.seeds if f"{side}/seed{seed}" in progress]
        if not runs:
            continue
        finals = [r["curve"][-1]["unaided_success"] if r["curve"] else 0.0 for r in runs]
        shares = [r["curve"][-1]["person_share"] if r["curve"] else None for r in runs]
        cpu = [sum(p.get("cpu_s", 0.0) for p in r["processes"].values()) for r in runs]
        # wait4 gives a parent the largest peak among it and the children it waited for (embodyrl's
        # train), not their sum: the largest process is the figure both systems can give
        peak = [max(p.get("peak_mb", 0.0) for p in r["processes"].values()) for r in runs]
        updates = [updates_of(root, side, seed) for seed in plan.seeds
                   if f"{side}/seed{seed}" in progress] if root is not None else []
        out["sides"][side] = {"seeds": len(runs), "final_unaided_success": float(np.mean(finals)),
                              "updates_by_seed": updates,
                              "best_window_by_seed": [max((p["unaided_success"] for p in r["curve"]), default=0.0)
                                                      for r in runs],
                              "steps_to_half_by_seed": [first_reaching(r["curve"], 0.5, "steps") for r in runs],
                              "final_unaided_success_by_seed": finals, "final_person_share_by_seed": shares,
                              "wall_s": float(np.mean([r["wall_s"] for r in runs])),
                              "cpu_s": float(np.mean(cpu)), "peak_mb_largest_process": float(np.mean(peak))}
    if {"embodyrl", "lerobot"} <= set(out["sides"]):
        level = out["sides"]["lerobot"]["final_unaided_success"]
        reach = {}
        for side in SIDES:
            runs = [progress[f"{side}/seed{s}"] for s in plan.seeds if f"{side}/seed{s}" in progress]
            reach[side] = {"steps": [first_reaching(r["curve"], level, "steps") for r in runs],
                           "wall_s": [first_reaching(r["curve"], level, "wall_s") for r in runs]}
        out["reach_lerobot_final"] = {"level": level, **reach}
    return out


def plot(progress: dict, plan: Plan, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    grid = np.linspace(0, plan.steps, 41)[1:]
    for side, colour in zip(SIDES, ("C0", "C1"), strict=True):
        runs = [progress[f"{side}/seed{s}"] for s in plan.seeds if f"{side}/seed{s}" in progress]
        for key, ax in (("unaided_success", axes[0]), ("person_share", axes[2])):
            ys = np.array([on_grid(r["curve"], key, grid) for r in runs if r["curve"]])
            if len(ys):
                ax.plot(grid, np.nanmean(ys, 0), color=colour, label=f"{side} ({len(ys)} seeds)")
                ax.fill_between(grid, np.nanmin(ys, 0), np.nanmax(ys, 0), color=colour, alpha=0.2)
        for r in runs:
            axes[1].plot([p["wall_s"] for p in r["curve"]], [p["unaided_success"] for p in r["curve"]],
                         color=colour, alpha=0.7)
    axes[0].set(xlabel="environment steps", ylabel=f"success without help (last {plan.window} episodes)")
    axes[1].set(xlabel="wall clock (s)", ylabel="success without help (each seed)")
    axes[2].set(xlabel="environment steps", ylabel="the person's share of steps")
    axes[0].legend()
    fig.suptitle("gym-hil PandaPickCube (state): embodyrl (RLPD) against LeRobot's HIL-SERL (SAC)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(root: Path, plan: Plan) -> dict:
    progress = json.loads((root / "progress.json").read_text())
    for result in progress.values():  # the curves from the episode logs, as this version draws them
        result["curve"] = curve(load_episodes(root / result["episodes"]), result["started"], plan.window)
    summary = summarise(progress, plan, root)
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(progress, plan, root / "curves.png")
    return summary


def table(summary: dict, faults: dict | None = None) -> str:
    """The docs' tables: the two systems side by side, and the faults."""
    sides = summary["sides"]
    rows = ["| | embodyrl | LeRobot |", "| --- | ---: | ---: |"]

    def row(name, key, fmt):
        rows.append(f"| {name} | " + " | ".join(fmt(sides[s][key]) if s in sides else "-" for s in SIDES) + " |")

    row("seeds", "seeds", str)
    row("success without help, last window (mean)", "final_unaided_success", lambda v: f"{v:.2f}")
    row("by seed", "final_unaided_success_by_seed", lambda v: " / ".join(f"{x:.2f}" for x in v))
    row("the person's share, last window, by seed", "final_person_share_by_seed",
        lambda v: " / ".join("-" if x is None else f"{x:.2f}" for x in v))
    row("best window by seed", "best_window_by_seed", lambda v: " / ".join(f"{x:.2f}" for x in v))
    row("steps to 0.5 without help, by seed", "steps_to_half_by_seed",
        lambda v: " / ".join("never" if x is None else f"{x:,}" for x in v))
    row("gradient updates by seed", "updates_by_seed", lambda v: " / ".join(f"{x:,}" if x else "-" for x in v))
    row("wall clock a run (s)", "wall_s", lambda v: f"{v:,.0f}")
    row("CPU a run (s, every process)", "cpu_s", lambda v: f"{v:,.0f}")
    row("peak memory of the largest process (MB)", "peak_mb_largest_process", lambda v: f"{v:,.0f}")
    out = "\n".join(rows)
    reach = summary.get("reach_lerobot_final")
    if reach:
        out += (f"\n\nLeRobot's final level {reach['level']:.2f}: steps to reach it by seed, embodyrl "
                f"{reach['embodyrl']['steps']}, LeRobot {reach['lerobot']['steps']}; seconds, embodyrl "
                f"{[None if x is None else round(x) for x in reach['embodyrl']['wall_s']]}, LeRobot "
                f"{[None if x is None else round(x) for x in reach['lerobot']['wall_s']]}")
    if faults:
        out += "\n\n| fault | " + " | ".join(faults) + " |\n| --- |" + " --- |" * len(faults)
        names = next(iter(faults.values()))["faults"]
        for name in names:
            out += f"\n| `{name}` | " + " | ".join(json.dumps(r["faults"].get(name)) for r in faults.values()) + " |"
        for key in ("steps_taken", "rows_held_at_end", "rows_lost"):
            out += f"\n| {key} | " + " | ".join(str(r.get(key)) for r in faults.values()) + " |"
    return out


def keep(root: Path, into: Path) -> None:
    """Copy what the docs cite into ``into``: the plan, the summary (``results.json``), progress and
    faults; a folder per run with its ``config.json`` (LeRobot's: the learner's), ``summary.json``
    (embodyrl's own; LeRobot's: its progress entry), ``metrics.jsonl.gz`` (embodyrl's metrics; for
    LeRobot its episode log, the only per-step record its run leaves here), the episode log and,
    for LeRobot, the actor's config."""
    import gzip
    import shutil

    into.mkdir(parents=True, exist_ok=True)
    for name, kept in (("plan.json", "plan.json"), ("progress.json", "progress.json"),
                       ("summary.json", "results.json"), ("faults.json", "faults.json")):
        if (root / name).exists():
            shutil.copy2(root / name, into / kept)
    progress = json.loads((root / "progress.json").read_text())

    def gzipped(source: Path, target: Path) -> None:
        with source.open("rb") as f, gzip.open(target, "wb") as out:
            shutil.copyfileobj(f, out)

    for key, result in progress.items():
        run, folder = root / key, into / key
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / result["episodes"], folder / "episodes.jsonl")
        if result["side"] == "embodyrl":
            for name in ("config.json", "summary.json"):
                shutil.copy2(run / name, folder / name)
            gzipped(run / "metrics.jsonl", folder / "metrics.jsonl.gz")
        else:
            shutil.copy2(run / "learner.json", folder / "config.json")
            shutil.copy2(run / "actor.json", folder / "actor.json")
            (folder / "summary.json").write_text(json.dumps(result, indent=2))
            gzipped(root / result["episodes"], folder / "metrics.jsonl.gz")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--venv", type=Path, default=None, help="the experiment's environment (default ROOT/venv)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--table", action="store_true", help="print the tables of what ROOT holds, run nothing")
    parser.add_argument("--keep", type=Path, default=None, help="with --table: copy the artifacts here")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="these seeds only")
    parser.add_argument("--lerobot-fps", type=int, default=None, help="pace LeRobot's actor (Plan.lerobot_fps)")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    if args.seeds is not None:
        plan = replace(plan, seeds=tuple(args.seeds))
    if args.lerobot_fps is not None:
        plan = replace(plan, lerobot_fps=args.lerobot_fps)
    root = args.root.resolve()
    if args.table:
        faults = root / "faults.json"
        print(table(report(root, plan), json.loads(faults.read_text()) if faults.exists() else None))
        if args.keep is not None:
            keep(root, args.keep)
        return 0
    root.mkdir(parents=True, exist_ok=True)
    python = venv_python((args.venv or root / "venv").resolve())
    (root / "plan.json").write_text(json.dumps(asdict(plan), indent=2))
    record_demos(python, root, plan)
    bounds = observation_bounds(python)
    progress_path = root / "progress.json"
    progress = json.loads(progress_path.read_text()) if progress_path.exists() else {}
    for seed in plan.seeds:
        for side in args.sides.split(","):
            key = f"{side}/seed{seed}"
            if key in progress:
                continue
            episodes = root / side / f"seed{seed}.episodes.jsonl"
            episodes.unlink(missing_ok=True)  # a run cut short starts again
            print(f"{key}: running", flush=True)
            result = (run_embodyrl(python, root, seed, plan) if side == "embodyrl"
                      else run_lerobot(python, root, seed, plan, bounds))
            rows = load_episodes(episodes)
            result["curve"] = curve(rows, result["started"], plan.window)
            progress[key] = result
            progress_path.write_text(json.dumps(progress, indent=2))
            last = result["curve"][-1] if result["curve"] else {}
            print(f"{key}: {len(rows)} episodes, {result['wall_s']:.0f} s, last window {last}", flush=True)
    print(json.dumps(report(root, plan)["sides"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
