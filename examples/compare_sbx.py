"""embodyrl beside SBX (Stable-Baselines-JAX), step for step, on this machine.

Both sides run with SBX 0.28's settings (256x256 MLPs, batch 256, learning
rates 3e-4, 10k uniform random steps, one update per step, TD3's exploration
noise 0.1) and are evaluated by the same code: every 5k steps the policy of
that moment plays 5 deterministic episodes on the seeded episodes
``embodyrl eval`` uses (seed 10000 + run seed + i). Three ways of training:

* ``embodyrl``: ``embodyrl train``, the real path (a learner process and an
  actor process over ZeroMQ, asynchronous);
* ``sync``: ``embodyrl train --synchronous``, the same algorithm package in
  one process, one environment step then one update (CleanRL's loop);
* ``sbx``: ``sbx.TD3`` / ``sbx.SAC``.

::

    pip install -e '.[compare]'     # SBX; never a dependency of embodyrl itself
    python examples/compare_sbx.py run                   # the plan, resumable: runs what is not done
    python examples/compare_sbx.py run --plan async      # the synchronous-against-asynchronous runs
    python examples/compare_sbx.py run --plan crossq     # CrossQ on both sides (hours a run on a CPU)
    python examples/compare_sbx.py report --plan all --out docs/figures/compare-sbx

Runs go one at a time, niced, their turns interleaved (for each seed, each
side in turn), each in its own process; a run is done when its
``summary.json`` exists, so the same command resumes after an interruption:
a run cut off goes on from its last checkpoint (embodyrl's own, through
``embodyrl train --resume``; SBX's model and replay buffer, saved every 10k
steps), and starts again if it had none (the synchronous loop always does). Several lanes may walk one plan at once (for
example ``--sides sbx`` beside ``--sides embodyrl,sync``): each run is
claimed by the lane that starts it. Each run directory keeps ``config.json``,
``metrics.jsonl``, ``eval.jsonl`` and ``summary.json``; the summary holds
wall-clock seconds, CPU seconds of the run's processes and the load average
around it (the machine is shared: compare CPU seconds where load differs).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

EVAL_EVERY = 5_000
EVAL_EPISODES = 5
RANDOM_STEPS = 10_000
SETTINGS = {"hidden_sizes": [256, 256], "batch_size": 256, "learning_rate": 3e-4,
            "random_steps": RANDOM_STEPS, "updates_per_step": 1, "td3_exploration_noise": 0.1,
            "eval_every": EVAL_EVERY, "eval_episodes": EVAL_EPISODES}
"""What both sides share (SBX 0.28's defaults for these algorithms, with TD3's noise of the RL Zoo)."""
CROSSQ = {"actor_hidden_sizes": [256, 256], "critic_hidden_sizes": [2048, 2048], "batch_size": 256,
          "learning_rate": 1e-3, "adam_b1": 0.5, "policy_delay": 3, "random_steps": 5_000, "updates_per_step": 1}
"""CrossQ's settings on both sides: the paper's (Bhatt et al. 2024), its critics 2048 wide (SBX's
default is 1024), 5k random steps first as its code takes them."""


CROSSQ_WIDTHS = {"crossq": 2048, "crossq-256": 256}
"""CrossQ's runs by their critics' width: the paper's, and one a CPU trains in minutes rather than
hours (everything else as :data:`CROSSQ`)."""


def crossq_settings(algorithm: str) -> dict:
    return {**CROSSQ, "critic_hidden_sizes": [CROSSQ_WIDTHS[algorithm]] * 2}


def registered(algorithm: str) -> str:
    """The name each library knows a run's algorithm by: every CrossQ width is CrossQ."""
    return "crossq" if algorithm in CROSSQ_WIDTHS else algorithm


def random_steps(algorithm: str) -> int:
    return CROSSQ["random_steps"] if algorithm in CROSSQ_WIDTHS else RANDOM_STEPS


@dataclass(frozen=True)
class Run:
    side: str  # embodyrl | sync | sbx, or embodyrl:VARIANT for one part of the path changed
    algorithm: str
    env: str
    seed: int
    steps: int

    @property
    def name(self) -> str:
        return f"{self.side.replace(':', '-')}-{self.algorithm}-{self.env}-s{self.seed}"


def plan(which: str) -> list[Run]:
    """The runs of a plan, in the order they are taken: seed by seed, sides interleaved. ``async``
    is the synchronous loop beside the parity runs' embodyrl SAC (the same seeds, the same runs),
    then the path's parts changed one at a time; ``parity`` ends with SAC's :data:`OPTIONS`; ``all``
    is both, each seed's synchronous run beside its parity runs; ``crossq`` is CrossQ on both sides,
    HalfCheetah and Hopper, 5 seeds to 100k (:data:`CROSSQ`: hours a run on a CPU, minutes on a GPU);
    ``crossq-cpu`` is the same with critics 256 wide, 3 seeds to 50k, beside the parity plan's SAC
    runs of those seeds (taken last: copy them in from its root to skip them)."""
    runs: list[Run] = []
    parity, sync = which in ("parity", "all"), which in ("async", "all")
    for seed in range(5):
        steps = 100_000 if seed < 3 else 50_000  # the first 3 go on to 100k; 50k is read off their curve
        for algorithm in ("td3", "sac"):
            if parity:
                runs += [Run(side, algorithm, "HalfCheetah-v5", seed, steps) for side in ("sbx", "embodyrl")]
        if sync and seed < 3:
            if not parity:
                runs.append(Run("embodyrl", "sac", "HalfCheetah-v5", seed, steps))
            runs.append(Run("sync", "sac", "HalfCheetah-v5", seed, 50_000))
    if parity:
        for seed in range(3):
            runs += [Run(side, "sac", "Hopper-v5", seed, 50_000) for side in ("sbx", "embodyrl")]
    if sync:
        for variant in VARIANTS:
            runs += [Run(f"embodyrl:{variant}", "sac", "HalfCheetah-v5", seed, 50_000) for seed in range(3)]
    if parity:
        for option in OPTIONS:
            runs += [Run(f"embodyrl:{option}", "sac", "HalfCheetah-v5", seed, 100_000) for seed in range(3)]
    if which == "crossq":  # beside the parity plan's SAC runs of the same seeds
        for seed in range(5):
            for env in ("HalfCheetah-v5", "Hopper-v5"):
                runs += [Run(side, "crossq", env, seed, 100_000) for side in ("sbx", "embodyrl")]
    if which == "crossq-cpu":
        for env in ("HalfCheetah-v5", "Hopper-v5"):
            for seed in range(3):
                runs += [Run(side, "crossq-256", env, seed, 50_000) for side in ("sbx", "embodyrl")]
        for seed in range(3):
            runs += [Run(side, "sac", "HalfCheetah-v5", seed, 100_000) for side in ("sbx", "embodyrl")]
            runs += [Run(side, "sac", "Hopper-v5", seed, 50_000) for side in ("sbx", "embodyrl")]
    return runs


VARIANTS: dict[str, list[str]] = {
    "tolerance": ["--learner.rate_tolerance", "256", "--learner.credit_quantum", "128"],
    "weights": ["--learner.publish_every", "16"],
    "prefetch": ["--learner.prefetch_batches", "0"],
    "calls": ["--learner.updates_per_call", "1", "--learner.publish_every", "1"],
}
"""One part of the asynchronous path changed at a time: variant -> its flags. ``tolerance`` lets the
actor run a quarter as far ahead of the updates (and the learner ahead of the ratio) as the default;
``weights`` publishes after every training call; ``prefetch`` samples each batch when it is
trained on; ``calls`` trains one update per call and publishes each."""

OPTIONS: dict[str, list[str]] = {
    "clip": ["--sac.log_std_bounds", "clip", "--sac.log_std_min", "-20"],
}
"""One of embodyrl's algorithm settings set to SBX's, on the first 3 SAC seeds to 100k: ``clip``
holds the actor's log std by clipping into [-20, 2] (SBX's; a fresh actor explores with std about
1) where the default rescales a tanh into [-5, 2] (std 0.22)."""


def embodyrl_command(run: Run, out: Path) -> list[str]:
    warm_up = str(random_steps(run.algorithm))
    command = [sys.executable, "-m", "embodyrl.cli", "train", f"gym:{run.env}", "--algorithm", registered(run.algorithm),
               "--steps", str(run.steps), "--seed", str(run.seed), "--run-dir", str(out), "--quiet",
               "--actor.random_steps", warm_up, "--learner.min_replay", warm_up,
               "--eval_episodes", str(EVAL_EPISODES), "--eval_every", str(EVAL_EVERY),
               "--actor.credit_timeout_s", "3600"]
    if run.algorithm in CROSSQ_WIDTHS:  # the package's defaults are the paper's; said here as SBX is told them
        settings = crossq_settings(run.algorithm)
        command += ["--crossq.hidden_sizes", str(settings["actor_hidden_sizes"]),
                    "--crossq.critic_hidden_sizes", str(settings["critic_hidden_sizes"]),
                    "--crossq.batch_size", str(settings["batch_size"]), "--crossq.adam_b1", str(settings["adam_b1"]),
                    "--crossq.policy_delay", str(settings["policy_delay"]),
                    "--crossq.actor_lr", str(settings["learning_rate"]), "--crossq.critic_lr", str(settings["learning_rate"]),
                    "--crossq.temperature_lr", str(settings["learning_rate"])]
        return command
    section = "ddpg" if run.algorithm == "td3" else "sac"
    command += [f"--{section}.actor_lr", "3e-4", f"--{section}.critic_lr", "3e-4",
                f"--{section}.hidden_sizes", "[256, 256]", f"--{section}.batch_size", "256"]
    command += ["--ddpg.exploration_noise", "0.1"] if run.algorithm == "td3" else ["--sac.temperature_lr", "3e-4"]
    side, _, variant = run.side.partition(":")
    if side == "sync":
        command.append("--synchronous")
    if variant:
        command += {**VARIANTS, **OPTIONS}[variant]
    return command


# -- the SBX side, in a process of its own -----------------------------------------------------
def sbx_main(algorithm: str, env_id: str, seed: int, steps: int, out: Path) -> None:
    import gymnasium as gym
    import numpy as np
    import sbx
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.noise import NormalActionNoise

    from embodyrl import robot
    from embodyrl.cli.evaluate import evaluate

    env = gym.make(env_id)
    dims = env.action_space.shape[0]
    kwargs = dict(learning_starts=RANDOM_STEPS, batch_size=256, learning_rate=3e-4, train_freq=1,
                  gradient_steps=1, policy_kwargs={"net_arch": [256, 256]}, seed=seed, verbose=0)
    if algorithm == "td3":
        kwargs["action_noise"] = NormalActionNoise(np.zeros(dims), 0.1 * np.ones(dims))
    crossq = algorithm in CROSSQ_WIDTHS
    settings = crossq_settings(algorithm) if crossq else SETTINGS
    if crossq:
        kwargs.update(learning_starts=settings["random_steps"], batch_size=settings["batch_size"],
                      learning_rate=settings["learning_rate"], policy_delay=settings["policy_delay"],
                      policy_kwargs={"net_arch": {"pi": settings["actor_hidden_sizes"], "qf": settings["critic_hidden_sizes"]},
                                     "optimizer_kwargs": {"b1": settings["adam_b1"]}})
    kind = {"td3": sbx.TD3, "sac": sbx.SAC, "crossq": sbx.CrossQ}[registered(algorithm)]
    saved = out / SBX_CHECKPOINT
    resume = _read_json(saved / "resume.json")  # {} unless a checkpoint was written whole
    if resume:
        model = kind.load(saved / "model.zip", env=env)
        model.load_replay_buffer(saved / "replay_buffer.pkl")  # this run's own file, never from a socket
        for name in ("metrics.jsonl", "eval.jsonl"):  # what came after the checkpoint is done again
            lines = (out / name).read_text().splitlines() if (out / name).exists() else []
            kept = [line for line in lines if json.loads(line)["env_steps"] <= resume["env_steps"]]
            (out / name).write_text("".join(line + "\n" for line in kept))
    else:
        model = kind("MlpPolicy", env, **kwargs)
    config = {"side": "sbx", "sbx": sbx.__version__, "algorithm": algorithm, "task": f"gym:{env_id}",
              "seed": seed, "steps": steps, **settings,
              **{k: getattr(model, k) for k in ("gamma", "tau", "buffer_size", "learning_starts", "batch_size")
                 if hasattr(model, k)},
              **({"policy_delay": model.policy_delay, "target_policy_noise": model.target_policy_noise,
                  "target_noise_clip": model.target_noise_clip} if algorithm == "td3" else
                 {"ent_coef": str(model.ent_coef_init if hasattr(model, "ent_coef_init") else model.ent_coef),
                  "target_entropy": str(model.target_entropy)})}
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    device, task = robot.load(f"gym:{env_id}").make()

    class Greedy:
        version = None

        def act(self, observation, explore=False):
            action, _ = model.predict(observation["observation"], deterministic=True)
            return np.asarray(action, dtype=np.float32), {}

    started = time.monotonic() - resume.get("time", 0.0)
    mode = "a" if resume else "w"
    metrics, evals = (out / "metrics.jsonl").open(mode), (out / "eval.jsonl").open(mode)

    def checkpoint() -> None:
        """Model and replay buffer, then ``resume.json``: a run cut off goes on from here."""
        saved.mkdir(exist_ok=True)
        (saved / "resume.json").unlink(missing_ok=True)
        model.save(saved / "model.zip")
        model.save_replay_buffer(saved / "replay_buffer.pkl")
        (saved / "resume.json").write_text(json.dumps({"env_steps": model.num_timesteps,
                                                        "time": round(time.monotonic() - started, 3)}))

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    metrics.write(json.dumps({"time": round(time.monotonic() - started, 3),
                                              "env_steps": self.num_timesteps,
                                              "episode_return": float(info["episode"]["r"])}) + "\n")
                    metrics.flush()
            if self.num_timesteps % EVAL_EVERY == 0:
                with device:
                    result = evaluate(device, task, Greedy(), EVAL_EPISODES, 10_000 + seed)
                evals.write(json.dumps({"env_steps": self.num_timesteps, "updates": max(0, self.num_timesteps - random_steps(algorithm)),
                                        "time": round(time.monotonic() - started, 3),
                                        "return_mean": result["return_mean"], "returns": result["returns"]}) + "\n")
                evals.flush()
            if self.num_timesteps % CHECKPOINT_EVERY == 0 and self.num_timesteps < steps:
                checkpoint()
            return True

    model.learn(steps - model.num_timesteps, callback=Record(), reset_num_timesteps=not resume)
    metrics.close()
    evals.close()
    shutil.rmtree(saved, ignore_errors=True)  # the run is whole: its checkpoint is no longer needed


# -- the runner --------------------------------------------------------------------------------
def _claim(run: Run, root: Path) -> Path | None:
    """Take ``run`` for this process: its claim file, or None when another live process holds it. A
    claim whose process is gone (a lane cut off) is taken over, so lanes share a plan without colliding."""
    root.mkdir(parents=True, exist_ok=True)
    claim = root / f"{run.name}.claim"
    while True:
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(claim.read_text() or 0), 0)
                return None  # held by a live lane
            except (ProcessLookupError, ValueError):
                claim.unlink(missing_ok=True)  # its lane is gone
                continue
            except FileNotFoundError:
                continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return claim


def run_one(run: Run, root: Path) -> None:
    claim = _claim(run, root)
    if claim is None:
        return
    try:
        _run_claimed(run, root / run.name)
    finally:
        claim.unlink(missing_ok=True)


def _run_claimed(run: Run, out: Path) -> None:
    root = out.parent
    if (out / "summary.json").exists():  # done (checked under the claim: no other lane is writing it)
        return
    resumed = out.exists() and resumable(run, out)
    if out.exists() and not resumed:  # a run cut off before its first checkpoint: start it again
        shutil.rmtree(out)
    starts = _read_json(out / RUNNER).get("starts", 1) + 1 if resumed else 1  # it was cut off once at least
    out.mkdir(parents=True, exist_ok=True)
    (out / RUNNER).write_text(json.dumps({"starts": starts}) + "\n")
    if run.side == "sbx":  # resumes by itself from its checkpoint (:func:`sbx_main`)
        command = [sys.executable, __file__, "_sbx", run.algorithm, run.env, str(run.seed), str(run.steps), str(out)]
    else:
        command = embodyrl_command(run, out) + (["--resume"] if resumed else [])
    print(f"{time.strftime('%H:%M:%S')} {run.name}: {' '.join(command[1:4])}{' (resumed)' if resumed else ''} ...",
          flush=True)
    load_before, cpu_before = os.getloadavg(), _children_cpu_s()
    started = time.monotonic()
    with (root / f"{run.name}.log").open("w") as log:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=lambda: os.nice(10))
    wall_s, cpu_s = time.monotonic() - started, _children_cpu_s() - cpu_before
    if done.returncode != 0:
        print(f"  failed ({done.returncode}); see {out.parent / (run.name + '.log')}", flush=True)
        return
    summary = {**_read_json(out / "summary.json"), "side": run.side, "algorithm": run.algorithm, "env": run.env,
               "seed": run.seed, "steps": run.steps, "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
               "starts": starts,  # above 1: resumed, and wall_s and cpu_s are the last start's only
               "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
               "evals": [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    last = summary["evals"][-1] if summary["evals"] else {}
    print(f"  {wall_s:.0f} s wall, {cpu_s:.0f} s CPU, return {last.get('return_mean', float('nan')):.0f} "
          f"at {last.get('env_steps')}", flush=True)


RUNNER = "runner.json"
"""The runner's record in a run directory: how many times the run was started."""
SBX_CHECKPOINT = "resume"
"""An SBX run's checkpoint folder: its model, replay buffer and ``resume.json`` (written last)."""
CHECKPOINT_EVERY = 10_000
"""Environment steps between an SBX run's checkpoints (embodyrl's runs keep their own)."""


def resumable(run: Run, out: Path) -> bool:
    """Whether a cut-off run goes on from a checkpoint: an SBX run's own, or an embodyrl run's (``embodyrl
    train --resume``). The synchronous loop does not resume: it starts again."""
    if run.side == "sbx":
        return (out / SBX_CHECKPOINT / "resume.json").exists()
    return run.side != "sync" and (out / "config.json").exists() and any((out / "checkpoints").glob("*"))


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


# -- the report -------------------------------------------------------------------------------
PUBLISHED = {("HalfCheetah-v5", "td3"): {50_000: 3_352, 100_000: 5_514},
             ("HalfCheetah-v5", "sac"): {50_000: 4_212, 100_000: 6_156},
             ("HalfCheetah-v5", "crossq"): {50_000: 6_345, 100_000: 8_112}}
"""Published means (10 seeds, earlier HalfCheetah versions: TD3 from sfujim/TD3's curves, SAC and
CrossQ from SimbaV2's baseline results), drawn for reference only."""


def bootstrap_interval(values, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """The 95 % percentile bootstrap interval of the mean of ``values``."""
    import numpy as np

    values = np.asarray(values, float)
    means = np.random.default_rng(seed).choice(values, (resamples, len(values))).mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def at(summary: dict, steps: int) -> float | None:
    """The evaluated return at ``steps`` on a run's curve (None: the run did not get there)."""
    return next((e["return_mean"] for e in summary.get("evals", []) if e["env_steps"] == steps), None)


def report(root: Path, out: Path, which: str) -> dict:
    """Per task, algorithm and side: returns at 50k and 100k (seeds, mean, bootstrap interval), wall
    clock and CPU; the verdict against SBX; the curves' plot (``OUT.png``); ``results.json``,
    ``table.md`` and every run's artifacts in ``OUT/``."""
    import numpy as np

    from embodyrl.runlog import keep_artifacts

    out.mkdir(parents=True, exist_ok=True)
    done = [(run, _read_json(root / run.name / "summary.json")) for run in plan(which)]
    done = [(run, summary) for run, summary in done if summary]
    groups: dict[tuple, dict] = {}
    for run, summary in done:
        group = groups.setdefault((run.env, run.algorithm), {}).setdefault(run.side, [])
        group.append((run, summary))
    rows = []
    for (env, algorithm), sides in sorted(groups.items()):
        for mark in (50_000, 100_000):
            row = {"env": env, "algorithm": algorithm, "steps": mark, "published": PUBLISHED.get((env, algorithm), {}).get(mark)}
            for side, runs in sides.items():
                values = [(r.seed, at(s, mark)) for r, s in runs if at(s, mark) is not None]
                if not values:
                    continue
                returns = [v for _, v in values]
                full = [s for r, s in runs if r.steps == mark and s.get("starts", 1) == 1]  # ended here, in one start
                row[side] = {"seeds": [seed for seed, _ in values], "returns": [round(v, 1) for v in returns],
                             "mean": round(float(np.mean(returns)), 1),
                             "interval": [round(x, 1) for x in bootstrap_interval(returns)],
                             "wall_s": round(float(np.mean([s["wall_s"] for s in full])), 1) if full else None,
                             "cpu_s": round(float(np.mean([s["cpu_s"] for s in full])), 1) if full else None}
            if "sbx" in row and "embodyrl" in row:
                if row["sbx"]["mean"] > 0:  # a ratio of returns means something only above zero
                    row["ratio"] = round(row["embodyrl"]["mean"] / row["sbx"]["mean"], 3)
                row["within_or_above_sbx_interval"] = row["embodyrl"]["mean"] >= row["sbx"]["interval"][0]
            if "sync" in row and "embodyrl" in row:  # over the synchronous loop's seeds, as the path table
                ours = dict(zip(row["embodyrl"]["seeds"], row["embodyrl"]["returns"], strict=True))
                same = [ours[seed] for seed in row["sync"]["seeds"] if seed in ours]
                if same:
                    row["async_minus_sync"] = round(float(np.mean(same)) - row["sync"]["mean"], 1)
            if any(side in row for side in sides):
                rows.append(row)
    result = {"settings": SETTINGS, "plan": which, "rows": rows,
              "runs": [{"name": run.name, **{k: summary.get(k) for k in ("wall_s", "cpu_s", "load_before", "load_after",
                                                                          "eval_return_mean", "policy_age")}}
                       for run, summary in done]}
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "table.md").write_text(markdown(rows) + "\n" + cost_table(rows) + "\n"
                                  + path_table(groups.get(("HalfCheetah-v5", "sac"), {})))
    plot_curves(groups, out.with_name(out.name + ".png"))  # beside the folder, as docs/figures keeps them
    keep_artifacts([root / run.name for run, _ in done], out / "runs")
    return result


def markdown(rows: list[dict]) -> str:
    sides = [side for side in ("sbx", "embodyrl", "sync", *(f"embodyrl:{v}" for v in (*VARIANTS, *OPTIONS)))
             if any(side in row for row in rows)]
    lines = ["| task | algorithm | steps | " + " | ".join(sides) + " | embodyrl / SBX | published |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in sides) + " | ---: | ---: |"]
    for row in rows:
        cells = []
        for side in sides:
            figures = row.get(side)
            cells.append("" if figures is None else
                         f"{figures['mean']:,.0f} [{figures['interval'][0]:,.0f}, {figures['interval'][1]:,.0f}] "
                         f"(n={len(figures['returns'])})")
        lines.append(f"| {row['env']} | {row['algorithm']} | {row['steps']:,} | " + " | ".join(cells)
                     + f" | {row.get('ratio', '')} | {row['published'] or ''} |")
    return "\n".join(lines) + "\n"


def cost_table(rows: list[dict]) -> str:
    """What a run cost each side: mean wall clock and CPU seconds of the runs that ended at that
    length, and embodyrl's CPU over SBX's (wall clock moves with the machine's load; CPU less)."""
    lines = ["| task | algorithm | run length | SBX wall s | SBX CPU s | embodyrl wall s | embodyrl CPU s "
             "| CPU, embodyrl / SBX |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        sbx, ours = row.get("sbx", {}), row.get("embodyrl", {})
        if sbx.get("cpu_s") is None or ours.get("cpu_s") is None:
            continue
        lines.append(f"| {row['env']} | {row['algorithm']} | {row['steps']:,} | {sbx['wall_s']:,.0f} | "
                     f"{sbx['cpu_s']:,.0f} | {ours['wall_s']:,.0f} | {ours['cpu_s']:,.0f} | "
                     f"{ours['cpu_s'] / sbx['cpu_s']:.2f} |")
    return "\n".join(lines) + "\n"


def path_table(sides: dict) -> str:
    """The synchronous loop against the real path and its parts changed one at a time (SAC,
    HalfCheetah, 50k), on the synchronous loop's seeds: return, its gap to the synchronous loop over
    the same seeds, the policy age, wall clock, CPU."""
    import numpy as np

    sync = {r.seed: at(s, 50_000) for r, s in sides.get("sync", []) if at(s, 50_000) is not None}
    if not sync:
        return ""
    lines = ["| path | return at 50k: mean [95 % interval] (seeds) | minus synchronous | policy age, mean "
             "updates | wall clock s (50k) | CPU s (50k) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for side in ("sync", "embodyrl", *(f"embodyrl:{v}" for v in VARIANTS)):
        runs = sorted(((r, s) for r, s in sides.get(side, []) if r.seed in sync and at(s, 50_000) is not None),
                      key=lambda pair: pair[0].seed)
        if not runs:
            continue
        returns = [at(s, 50_000) for _, s in runs]
        low, high = bootstrap_interval(returns)
        gap = np.mean(returns) - np.mean([sync[r.seed] for r, _ in runs])
        ages = [s["policy_age"]["mean"] for _, s in runs if s.get("policy_age", {}).get("rows")]
        ended = [s for r, s in runs if r.steps == 50_000]
        lines.append(f"| {side} | {np.mean(returns):,.0f} [{low:,.0f}, {high:,.0f}] "
                     f"({', '.join(f's{r.seed} {at(s, 50_000):,.0f}' for r, s in runs)}) | {gap:+,.0f} | "
                     f"{np.mean(ages) if ages else 0:.0f} | "
                     + (f"{np.mean([s['wall_s'] for s in ended]):,.0f} | {np.mean([s['cpu_s'] for s in ended]):,.0f} |"
                        if ended else "(100k runs) | |"))
    return "\n".join(lines) + "\n"


def plot_curves(groups: dict, path: Path) -> None:
    """One panel per task and algorithm: each side's mean evaluated return over steps, its seeds'
    range shaded, published means as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = sorted(groups)
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for side, runs in sorted(groups[key].items()):
            marks = sorted({e["env_steps"] for _, s in runs for e in s.get("evals", [])})
            curves = [[at(s, m) for m in marks] for _, s in runs]
            mean = [np.mean([c[i] for c in curves if c[i] is not None]) for i in range(len(marks))]
            low = [min(c[i] for c in curves if c[i] is not None) for i in range(len(marks))]
            high = [max(c[i] for c in curves if c[i] is not None) for i in range(len(marks))]
            line, = ax.plot(marks, mean, label=f"{side} ({len(runs)} seeds)")
            ax.fill_between(marks, low, high, color=line.get_color(), alpha=0.15)
        published = PUBLISHED.get(key, {})
        if published:
            ax.plot(list(published), list(published.values()), "k*", label="published mean (10 seeds)")
        ax.set_title(f"{key[0]} {key[1].upper()}")
        ax.set_xlabel("environment steps")
        ax.set_ylabel("evaluated return (5 episodes)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_sbx":
        algorithm, env_id, seed, steps, out = argv[1:]
        sbx_main(algorithm, env_id, int(seed), int(steps), Path(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run what the plan has not done yet")
    r.add_argument("--plan", choices=("parity", "async", "all", "crossq", "crossq-cpu"), default="parity")
    r.add_argument("--sides", default="", help="comma-separated sides to run (default: all of the plan's)")
    r.add_argument("--root", type=Path, default=Path("runs/compare"))
    r.add_argument("--only", default="*", help="run only the plan's runs whose names match this pattern "
                                               "(fnmatch, e.g. '*-sac-HalfCheetah-v5-s3')")
    rp = sub.add_parser("report", help="tables, curves and kept artifacts of the runs done so far")
    rp.add_argument("--plan", choices=("parity", "async", "all", "crossq", "crossq-cpu"), default="parity")
    rp.add_argument("--root", type=Path, default=Path("runs/compare"))
    rp.add_argument("--out", type=Path, default=Path("runs/compare-report"))
    args = parser.parse_args(argv)
    if args.command == "report":
        result = report(args.root, args.out, args.plan)
        print((args.out / "table.md").read_text())
        print(json.dumps([{k: r.get(k) for k in ("env", "algorithm", "steps", "ratio", "within_or_above_sbx_interval",
                                                 "async_minus_sync")} for r in result["rows"]], indent=1))
    if args.command == "run":
        sides = set(filter(None, args.sides.split(",")))
        for run in plan(args.plan):
            if (not sides or run.side.partition(":")[0] in sides) and fnmatch.fnmatch(run.name, args.only):
                run_one(run, args.root)


if __name__ == "__main__":
    main()
