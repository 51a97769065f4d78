"""A person in the loop pays off: four ways to learn the arm's push task through a robot server.

::

    nice -n 10 python examples/hil_robot.py --out runs/hil     # hours; resumes with the same command
    python examples/hil_robot.py --out runs/hil-quick --quick  # minutes: the same steps and keys, tiny

The stand-in for a real arm is :mod:`embodyrl.envs.arm_push` (the 7-joint
arm pushing a block to a target, sparse success reward, a top camera),
served by ``python -m embodyrl.hal.robot_server`` over TCP with CurveZMQ
keys, exactly as a real arm would be; every step below drives it through
robot files and the ``embodyrl`` command line:

1. keys for the robot server and the actor (``embodyrl keys``);
2. ``embodyrl record`` 20 demonstrations with the scripted expert as the
   teleoperator; for the classifier only, 40 more expert episodes in other
   scenes (its successes) and 40 near misses of a script that pushes the
   block toward a decoy (its failures, as HIL-SERL records failures);
3. ``embodyrl reward train`` a success classifier on the top camera's
   64 x 64 frames (the last 2 of each successful episode are positive);
4. ``embodyrl train``, per variant and seed, in segments of the step budget;
   after each segment the saved policy runs ``--eval-episodes`` episodes
   scored by the task's true success, whatever the run's reward was:

   * ``scratch``: SAC, no demonstrations;
   * ``demos``: RLPD with the demonstrations (50/50 sampling);
   * ``demos_interventions``: RLPD with demonstrations and a scripted person
     who takes over with the expert when the arm drifts out of a corridor
     (:func:`embodyrl.envs.arm_push.person`);
   * ``classifier_reward``: like the last, the reward given only by the
     trained classifier (``reward: classifier:DIR`` in the robot file).

Everything is written as it happens: the demonstrations, the classifier, each
run directory (``--resume`` continues it), and ``results.json`` after every
evaluation, so an interrupted experiment resumes where it stopped. With
``--keep DIR`` each finished run's config, summary and metrics, the
classifier and the progress are also copied to DIR (small: no replay, no
checkpoints); on a machine where ``--out`` is empty they are read back from
there, so the experiment goes on from its last finished run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import yaml

ROBOT_FACTORY = "embodyrl.envs.arm_push:make_camera_device"
EXPERT = "script:embodyrl.envs.arm_push:expert"
WANDER = "script:embodyrl.envs.arm_push:wander"
PERSON = "script:embodyrl.envs.arm_push:person"
CAMERA = "camera/top"


@dataclass(frozen=True)
class Plan:
    """The experiment's sizes."""

    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 20_000
    """Environment steps per run (the same budget for every variant)."""
    points: int = 8
    """Evaluations per run, evenly spaced over the budget."""
    eval_episodes: int = 20
    demos: int = 20
    successes: int = 40
    """More expert episodes, for the classifier only (its positives: HIL-SERL records a few hundred)."""
    negatives: int = 40
    """Near-miss episodes recorded for the classifier (its failures; a few succeed on the way)."""
    updates_per_step: float = 2.0
    settings: tuple[str, ...] = ("--learner.n_step", "3", "--sac.discount", "0.97", "--sac.init_temperature", "0.1")
    """The same for every variant: 3-step returns and a shorter horizon carry the sparse reward back
    faster (SERL trains at discount 0.95 to 0.97); a cooler start explores less at random."""
    classifier_steps: int = 3000
    classifier_last_k: int = 2
    """Positive frames per successful episode: the episode ends on success, so its last two frames
    show the block on the target (the first touching the disc's edge)."""
    port: int = 5671

    @classmethod
    def quick(cls) -> Plan:
        return cls(seeds=(0,), steps=300, points=1, eval_episodes=3, demos=3, successes=1, negatives=2,
                   classifier_steps=60, port=5672)


VARIANTS = {
    "scratch": {"algorithm": "sac", "demos": False, "person": False, "classifier": False},
    "demos": {"algorithm": "rlpd", "demos": True, "person": False, "classifier": False},
    "demos_interventions": {"algorithm": "rlpd", "demos": True, "person": True, "classifier": False},
    "classifier_reward": {"algorithm": "rlpd", "demos": True, "person": True, "classifier": True},
    "crossq_demos_interventions": {"algorithm": "crossq", "demos": True, "person": True, "classifier": False},
}
"""The last is the person-in-the-loop variant with CrossQ's critics (batch-renormalised, no target
networks) in place of RLPD's ensemble, under RLPD's mixing (:data:`CROSSQ_FLAGS`)."""

CROSSQ_CPU_WIDTH = ("--crossq.critic_hidden_sizes", "[256, 256]")
"""CrossQ's critics as wide as SAC's and RLPD's: the paper's 2048 train 20x slower on a CPU."""
CROSSQ_FLAGS = ("--learner.mix", "{demonstration: 0.5, online: 0.5}", *CROSSQ_CPU_WIDTH)
"""CrossQ under RLPD's 50/50 sampling of demonstrations (and interventions) against online steps."""


def settings(plan: Plan, algorithm: str) -> list[str]:
    """The plan's shared settings in ``algorithm``'s section (RLPD is SAC's), and CrossQ's own flags."""
    section = "crossq" if algorithm == "crossq" else "sac"
    flags = [f"--{section}." + flag.removeprefix("--sac.") if flag.startswith("--sac.") else flag
             for flag in plan.settings]
    return flags + list(CROSSQ_FLAGS) if algorithm == "crossq" else flags


def cli(*args: str, cwd: Path, log: Path | None = None, timeout: float | None = None) -> str:
    """``embodyrl ARGS`` in ``cwd``; its stdout (stderr appended to ``log``); a failure raises, with stderr's tail."""
    proc = subprocess.run([sys.executable, "-m", "embodyrl.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ embodyrl {' '.join(args)}\n{proc.stderr}")
    if proc.returncode != 0:
        raise RuntimeError(f"embodyrl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def make_keys(out: Path) -> None:
    for who in ("robot", "actor"):
        if not (out / "keys" / who / f"{who}.key_secret").exists():
            cli("keys", str(out / "keys" / who), who, cwd=out)
    authorized = out / "keys" / "authorized"
    authorized.mkdir(exist_ok=True)
    (authorized / "actor.key").write_bytes((out / "keys" / "actor" / "actor.key").read_bytes())


def write_robot_files(out: Path, plan: Plan) -> None:
    """``push.yaml`` (the task's own sparse reward) and ``push_classifier.yaml`` (the classifier's)."""
    base = {
        "name": "push",
        "device": {"endpoint": f"tcp://127.0.0.1:{plan.port}",
                   "keys": {"secret_key": "keys/actor/actor.key_secret", "server_key": "keys/robot/robot.key"},
                   "timeout_s": 2.0, "retries": 3},
        "task": {"factory": "embodyrl.envs.arm_push:Push"},
        "control": {"rate_hz": 20, "episode_steps": 50, "realtime": False},
        "reset": "auto",
        "reward_only": [CAMERA],
    }
    with_classifier = {**base, "task": {"reward": "classifier:classifier", "end_on_success": True}}
    for name, data in (("push.yaml", base), ("push_classifier.yaml", with_classifier)):
        text = yaml.safe_dump(data, sort_keys=False)
        path = out / name
        if not path.exists() or path.read_text() != text:  # unchanged on a resume: runs record its hash
            path.write_text(text)


@contextmanager
def robot_server(out: Path, plan: Plan):
    """The robot server, as on the robot's own controller: keys, TCP, its own process."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", plan.port)) == 0:
            raise RuntimeError(f"port {plan.port} is taken: stop what listens there or pass --port")
    # The simulated arm is not paced: its actor waits for the learner's credit between batches, so the
    # update-to-data ratio holds exactly; the watchdog allows those waits. A real arm runs in real time.
    # The driver deadline (0.5 s by default, whose overrun latches a hung-driver e-stop) is 5 s here: a
    # simulation sharing two cores with a learner and a test suite was seen to take 0.57 s for one step.
    log = (out / "robot_server.log").open("a")
    proc = subprocess.Popen([sys.executable, "-m", "embodyrl.hal.robot_server", ROBOT_FACTORY,
                             "--bind", f"tcp://127.0.0.1:{plan.port}", "--watchdog-s", "60",
                             "--command-deadline-s", "5",
                             "--secret-key", "keys/robot/robot.key_secret", "--authorized-keys", "keys/authorized"],
                            cwd=out, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", plan.port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the robot server did not start (see {out / 'robot_server.log'})")
            time.sleep(0.2)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def record(out: Path, plan: Plan) -> dict:
    """The demonstrations and the classifier's extra failures (``embodyrl record`` resumes by itself)."""
    log = out / "commands.log"
    cli("record", "push.yaml", "--teleop", EXPERT, "--episodes", str(plan.demos), "--out", "demos", cwd=out, log=log)
    # other scenes than the demonstrations' (record seeds episode i with --seed + i)
    cli("record", "push.yaml", "--teleop", EXPERT, "--episodes", str(plan.successes), "--out", "successes",
        "--seed", "1000", cwd=out, log=log)
    cli("record", "push.yaml", "--teleop", WANDER, "--episodes", str(plan.negatives), "--out", "wander",
        "--seed", "2000", cwd=out, log=log)
    summary = json.loads(cli("demos", "demos", "--json", cwd=out))
    return {k: v for k, v in summary.items() if k != "by_episode"}


def train_classifier(out: Path, plan: Plan) -> dict:
    done = out / "classifier" / "metrics.json"
    if not done.exists():
        cli("reward", "train", "demos", "successes", "wander", "--out", "classifier", "--camera", CAMERA,
            "--steps", str(plan.classifier_steps), "--last-k", str(plan.classifier_last_k), "--seed", "0",
            cwd=out, log=out / "commands.log")
    return json.loads(done.read_text())


def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / "runs" / f"{variant}-s{seed}"


def replay_rows(plan: Plan) -> int:
    """A run's replay holds all it will see: its steps, an episode's final row each (at least 1 in
    50), the demonstrations and a margin. The replay reserves its capacity on disk when it opens
    (64 x 64 camera rows are ~16 KB: the default million rows would be 16 GB a run)."""
    return int(plan.steps * 1.1) + 60 * plan.demos + 2048


def train_to(out: Path, plan: Plan, variant: str, seed: int, steps: int) -> None:
    """``embodyrl train`` of one variant and seed up to ``steps`` (a fresh run, or --resume)."""
    spec = VARIANTS[variant]
    run = run_dir(out, variant, seed)
    args = ["train", "push_classifier.yaml" if spec["classifier"] else "push.yaml", "--run-dir", str(run),
            "--algorithm", spec["algorithm"], "--steps", str(steps), "--seed", str(seed), "--quiet",
            "--eval_episodes", "1", "--learner.updates_per_step", str(plan.updates_per_step),
            "--actor.credit_timeout_s", "3600",  # a learner slowed by other work is waited for, not failed
            "--learner.replay_capacity", str(replay_rows(plan)), *settings(plan, spec["algorithm"])]
    if spec["demos"]:
        args += ["--demos", "demos"]
    if spec["person"]:
        args += ["--teleop", PERSON]
    if (run / "config.json").exists():
        args.append("--resume")  # no second warm-up: a resumed run with rows records random_steps 0
    else:
        args += ["--actor.random_steps", str(min(1000, plan.steps // 10)),
                 "--learner.min_replay", "1000"]  # the default, given: --quick's 300 steps check the keys, not learning
    cli(*args, cwd=out, log=out / "commands.log")


def intervention_rate(metrics: list[dict], since_steps: int) -> float | None:
    """The share of an episode's steps a person took over, mean over the episodes that ended after
    ``since_steps`` (each learner record's mean weighted by the episodes it counts); None when no such episode has one."""
    total, episodes, before = 0.0, 0, 0
    for record in metrics:
        if "episodes" not in record:  # not a training record (the final evaluation's)
            continue
        ended = max(0, record["episodes"] - before)
        if record["env_steps"] > since_steps and record.get("intervention_rate") is not None:
            total, episodes = total + ended * record["intervention_rate"], episodes + ended
        before = record["episodes"]
    return total / episodes if episodes else None


def evaluate(out: Path, plan: Plan, variant: str, seed: int, since_steps: int = 0) -> dict:
    """The run's saved policy on the robot, scored by the task's true success; the person's share of
    the steps over the segment trained since ``since_steps``."""
    from embodyrl.cli.evaluate import evaluate as run_episodes
    from embodyrl.config import load
    from embodyrl.envs.arm_push import Push
    from embodyrl.policy import load_run_policies
    from embodyrl.robot import of_config
    from embodyrl.runlog import learner_records

    run = run_dir(out, variant, seed)
    config = load(run / "config.json")
    robot = of_config(config)
    policy = load_run_policies(run, config.algo, robot.layout(), seed=seed)[0]
    device, _ = robot.make()  # the robot file's device: the robot server, with the actor's keys
    with device:
        result = run_episodes(device, Push(), policy, plan.eval_episodes, seed=50_000 + 1000 * seed)
    metrics = learner_records(run)
    return {"steps": int(metrics[-1]["env_steps"]), "success_rate": result["success_mean"],
            "return_mean": result["return_mean"], "intervention_rate": intervention_rate(metrics, since_steps),
            "policy_version": list(policy.version)}


def load_progress(out: Path) -> dict:
    path = out / "progress.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_json(path: Path, data) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def results(progress: dict, plan: Plan, classifier: dict, demos: dict, wall_s: float) -> dict:
    """``results.json``: per variant the curve (mean over seeds) and each seed's."""
    variants = {}
    for variant in VARIANTS:
        by_seed = {seed: progress.get(f"{variant}/{seed}", []) for seed in plan.seeds}
        points = min(len(v) for v in by_seed.values())
        entry = {"steps": [], "success_rate": [], "success_rate_by_seed": {str(s): [] for s in plan.seeds}}
        if VARIANTS[variant]["person"]:
            entry["intervention_rate"] = []
            entry["intervention_rate_by_seed"] = {str(s): [] for s in plan.seeds}
        for i in range(points):
            entry["steps"].append(int(np.mean([by_seed[s][i]["steps"] for s in plan.seeds])))
            entry["success_rate"].append(float(np.mean([by_seed[s][i]["success_rate"] for s in plan.seeds])))
            for s in plan.seeds:
                entry["success_rate_by_seed"][str(s)].append(by_seed[s][i]["success_rate"])
            if VARIANTS[variant]["person"]:
                rates = [by_seed[s][i]["intervention_rate"] for s in plan.seeds]
                known = [r for r in rates if r is not None]
                entry["intervention_rate"].append(float(np.mean(known)) if known else None)
                for s, r in zip(plan.seeds, rates, strict=True):
                    entry["intervention_rate_by_seed"][str(s)].append(r)
        variants[variant] = {**VARIANTS[variant], **entry}
    return {"variants": variants,
            "classifier": {"precision": classifier["precision"], "recall": classifier["recall"],
                           **{k: v for k, v in classifier.items() if k not in ("precision", "recall")}},
            "demonstrations": demos, "plan": asdict(plan), "wall_s": round(wall_s, 1),
            "goals": goals(variants, plan)}


def first_reaching(entry: dict, level: float) -> int | None:
    for steps, rate in zip(entry["steps"], entry["success_rate"], strict=True):
        if rate >= level:
            return steps
    return None


def goals(variants: dict, plan: Plan) -> dict:
    """Each goal: met, not met, or open (not all points are in yet)."""
    complete = all(len(v["steps"]) == plan.points for v in variants.values())
    c, a, d = variants["demos_interventions"], variants["scratch"], variants["classifier_reward"]
    if not complete:
        return {"complete": False}
    c_at = first_reaching(c, 0.9)
    a_at = first_reaching(a, 0.9)
    final_rate = c["intervention_rate"][-1]
    return {
        "complete": True,
        "demos_interventions_reaches_90": c_at is not None,
        "demos_interventions_steps_to_90": c_at,
        "scratch_steps_to_90": a_at,
        "a_third_of_scratch": c_at is not None and (a_at is None or c_at <= a_at / 3),
        "intervention_rate_final": final_rate,
        "intervention_rate_below_5pct": final_rate is not None and final_rate < 0.05,
        "classifier_within_10_points": abs(d["success_rate"][-1] - c["success_rate"][-1]) <= 0.10,
        "crossq_steps_to_90": first_reaching(variants["crossq_demos_interventions"], 0.9),
    }


LABELS = {"scratch": "SAC from scratch", "demos": "RLPD + 20 demonstrations",
          "demos_interventions": "RLPD + demonstrations + interventions",
          "classifier_reward": "the same, reward from the classifier",
          "crossq_demos_interventions": "CrossQ + demonstrations + interventions"}


def plot(result: dict, path: Path) -> None:
    """Success rate (mean over seeds, each seed faint) and the intervention rate against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (name, v) in enumerate(result["variants"].items()):
        colour = f"C{i}"
        left.plot(v["steps"], v["success_rate"], color=colour, marker="o", label=LABELS[name])
        for curve in v["success_rate_by_seed"].values():
            left.plot(v["steps"][:len(curve)], curve, color=colour, alpha=0.25, linewidth=0.8)
        if "intervention_rate" in v:
            right.plot(v["steps"], v["intervention_rate"], color=colour, marker="o", label=LABELS[name])
    left.axhline(0.9, color="grey", linestyle=":", linewidth=0.8)
    left.set(xlabel="environment steps", ylabel="evaluation success (20 episodes)", ylim=(-0.02, 1.02))
    right.axhline(0.05, color="grey", linestyle=":", linewidth=0.8)
    right.set(xlabel="environment steps", ylabel="steps a person took over", ylim=(0, None))
    left.legend(fontsize=7, loc="upper left")
    right.legend(fontsize=7)
    fig.suptitle("arm_push through a robot server (CurveZMQ), mean of the seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict) -> str:
    """Markdown: each variant's success rate at every evaluation, and its last intervention rate."""
    first = next(iter(result["variants"].values()))
    head = "| variant | " + " | ".join(f"{s:,}" for s in first["steps"]) + " | interventions (last) |"
    lines = [head, "|" + "---|" * (len(first["steps"]) + 2)]
    for name, v in result["variants"].items():
        rate = v.get("intervention_rate", [None])[-1] if v["steps"] else None
        lines.append(f"| {LABELS[name]} | " + " | ".join(f"{x:.2f}" for x in v["success_rate"])
                     + f" | {'—' if rate is None else f'{rate:.3f}'} |")
    return "\n".join(lines)


SMALL = ("plan.json", "progress.json", "results.json")


def copy_progress(source: Path, target: Path) -> None:
    """The plan, progress, results and a trained classifier, from ``source`` to ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for name in SMALL:
        if (source / name).exists():
            shutil.copy2(source / name, target / name)
    if (source / "classifier" / "metrics.json").exists():  # written last: the classifier is whole
        shutil.copytree(source / "classifier", target / "classifier", dirs_exist_ok=True)


def keep(out: Path, into: Path, progress: dict, plan: Plan) -> None:
    """Copy what another machine needs to go on, and what checks the result: finished runs' artifacts."""
    from embodyrl.runlog import keep_artifacts

    copy_progress(out, into)
    finished = [run_dir(out, v, s) for v in VARIANTS for s in plan.seeds
                if len(progress.get(f"{v}/{s}", [])) == plan.points
                and run_dir(out, v, s).is_dir()]  # a run restored from ``into`` is there already
    if finished:
        keep_artifacts(finished, into / "runs")


def restore(out: Path, kept: Path) -> None:
    """An empty ``out`` takes the plan, progress and classifier kept in ``kept``. Runs not yet finished
    start again, and so does a finished run whose kept artifacts are gone: its points could not be checked."""
    from embodyrl.runlog import missing_artifacts

    if (out / "progress.json").exists() or not (kept / "progress.json").exists():
        return
    copy_progress(kept, out)
    progress = load_progress(out)
    for key in [k for k in progress if not k.startswith("_")]:
        variant, seed = key.split("/")
        kept_run = run_dir(kept, variant, int(seed))
        missing = missing_artifacts(kept_run)
        if len(progress[key]) and missing:
            print(f"{key}: {kept_run} lacks its {', '.join(missing)}; it starts again", flush=True)
            del progress[key]
    save_json(out / "progress.json", progress)
    print(f"restored the progress kept in {kept}", flush=True)


def run(out: Path, plan: Plan, kept: Path | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    save_json(out / "plan.json", asdict(plan))
    make_keys(out)
    write_robot_files(out, plan)
    progress = load_progress(out)
    wall_before = progress.pop("_wall_s", 0.0)
    checkpoints = [round(plan.steps * (i + 1) / plan.points) for i in range(plan.points)]
    with robot_server(out, plan):
        demos = record(out, plan)
        print(f"demonstrations: {json.dumps(demos)}", flush=True)
        classifier = train_classifier(out, plan)
        print(f"classifier: held-out precision {classifier['precision']} recall {classifier['recall']}", flush=True)
        for seed in plan.seeds:
            for variant in VARIANTS:
                key = f"{variant}/{seed}"
                done = progress.setdefault(key, [])
                if done and len(done) < plan.points and not (run_dir(out, variant, seed) / "config.json").exists():
                    print(f"{key}: its run directory is gone; it starts again", flush=True)
                    done.clear()  # a half run cannot resume without its replay and checkpoint
                for point in checkpoints[len(done):]:
                    t0 = time.monotonic()
                    train_to(out, plan, variant, seed, point)
                    row = evaluate(out, plan, variant, seed, since_steps=done[-1]["steps"] if done else 0)
                    row["wall_s"] = round(time.monotonic() - t0, 1)
                    done.append(row)
                    wall = wall_before + time.monotonic() - started
                    save_json(out / "progress.json", {**progress, "_wall_s": wall})
                    save_json(out / "results.json", results(progress, plan, classifier, demos, wall))
                    if kept is not None and len(done) == plan.points:
                        keep(out, kept, progress, plan)
                    helped = VARIANTS[variant]["person"] and row["intervention_rate"] is not None
                    print(f"{key} @ {row['steps']}: success {row['success_rate']:.2f}"
                          + (f", interventions {row['intervention_rate']:.3f}" if helped else "")
                          + f" ({row['wall_s']} s)", flush=True)
    wall = wall_before + time.monotonic() - started
    final = results(progress, plan, classifier, demos, wall)
    save_json(out / "results.json", final)
    plot(final, out / "hil_robot.png")
    if kept is not None:
        keep(out, kept, progress, plan)
    return final


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Scratch vs demonstrations vs a person in the loop vs a learnt "
                                                 "reward, on the arm's push task through a robot server")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--quick", action="store_true", help="a tiny run of every step (minutes)")
    parser.add_argument("--seeds", type=int, help="number of seeds (default 3; 1 with --quick)")
    parser.add_argument("--seed", type=int, action="append", help="run only this seed (repeatable): another "
                                                                   "process, --out, --keep and --port take the others")
    parser.add_argument("--steps", type=int, help="environment steps per run")
    parser.add_argument("--port", type=int, help="the robot server's port on 127.0.0.1")
    parser.add_argument("--keep", type=Path, help="copy finished runs' small artifacts here, and resume from "
                                                  "here when --out is empty (another machine)")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    if args.seeds is not None:
        plan = replace(plan, seeds=tuple(range(args.seeds)))
    if args.seed:
        plan = replace(plan, seeds=tuple(args.seed))
    if args.steps is not None:
        plan = replace(plan, steps=args.steps)
    if args.port is not None:
        plan = replace(plan, port=args.port)
    if args.keep is not None:
        restore(args.out, args.keep)
    saved = args.out / "plan.json"
    if saved.exists() and json.loads(saved.read_text()) != json.loads(json.dumps(asdict(plan))):
        print(f"{args.out} holds an experiment of another plan ({saved}); use another --out", file=sys.stderr)
        return 2
    result = run(args.out.resolve(), plan, args.keep.resolve() if args.keep else None)
    print(table(result))
    print(json.dumps(result["goals"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
