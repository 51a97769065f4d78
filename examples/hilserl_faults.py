"""The same faults on LeRobot's HIL-SERL and on embodyrl, on gym-hil's PandaPickCube, counted from each
system's own data.

One run a system (the side-by-side experiment's task, demonstrations, person and settings; the learner
and the actor as separate processes, as on a robot), and, every ``every`` environment steps, one fault:

1. ``actor_sigkill``: SIGKILL the actor, start it again;
2. ``learner_ctrl_c_in_checkpoint``: while the learner writes a checkpoint, Ctrl-C twice (a person whose
   first Ctrl-C did not stop it at once; LeRobot's learner exits on the second), then start it again
   with its resume flag;
3. ``actor_restart``: Ctrl-C the actor, start it again;
4. ``learner_restart``: Ctrl-C the learner once, wait for it to exit, start it again with its resume flag.

For each: how long until the system took the actor's steps again (an actor: its first episode after the
start; a learner: LeRobot's actor stream connected to it again, embodyrl's replay grew), or "hung" past
``recover_s``; and the rows lost over the run: every step the actors took (each process counts its own,
unfinished episodes included: :data:`embodyrl.envs.panda_pick.STEP_COUNT`) against the rows the learner
holds at the end (LeRobot: its last checkpoint's replay dataset, written after the last actor stopped;
embodyrl: ``embodyrl replay``'s rows by actor). ::

    python examples/hilserl_faults.py --root runs/hilserl   # after (or beside) hilserl_side_by_side.py
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hilserl_side_by_side import (  # noqa: E402
    PERSON,
    REPO,
    TASK,
    Plan,
    embodyrl_settings,
    environ,
    lerobot_config,
    load_episodes,
    niced,
    observation_bounds,
    record_demos,
    venv_python,
)


@dataclass(frozen=True)
class FaultPlan:
    seed: int = 10
    every: int = 800
    """Environment steps before each fault."""
    tail: int = 800
    """Environment steps after the last one."""
    recover_s: float = 180.0
    port: int = 50071
    checkpoint_every_s: float = 2.0
    """embodyrl's learner checkpoints this often in this run (default 60 s), so that a checkpoint is
    being written within seconds of the fault's moment."""
    lerobot_save_every: int = 200
    """LeRobot's learner checkpoints (and rewrites its replay) every this many updates in this run
    (its config's ``save_freq``), so that it has checkpointed before the first learner fault."""

    @classmethod
    def quick(cls) -> FaultPlan:
        return cls(every=150, tail=100, recover_s=120.0, port=50072, lerobot_save_every=50)


class Side:
    """One system's learner and actor processes in this run's directory."""

    name = ""

    def __init__(self, python: Path, root: Path, plan: Plan, faults: FaultPlan):
        self.python, self.root, self.plan, self.faults = python, root, plan, faults
        self.run = root / "faults" / self.name
        self.run.mkdir(parents=True, exist_ok=True)
        self.episodes = self.run / "episodes.jsonl"
        self.learner: subprocess.Popen | None = None
        self.actor: subprocess.Popen | None = None
        self.actor_starts = 0
        self.fresh = 0
        """Fresh learner starts after a resume that failed (each in a directory of its own)."""
        self.taken: list[int] = []
        """Steps each finished actor process took."""

    def log(self, who: str):
        return (self.run / f"{who}.log").open("a")

    def step_count(self) -> Path:
        return self.run / f"actor{self.actor_starts}.steps"

    def start_actor(self) -> None:
        self.actor_starts += 1
        self.actor = subprocess.Popen(niced(self.actor_command()), cwd=self.run, stdout=self.log("actor"),
                                      stderr=subprocess.STDOUT,
                                      env=environ(self.episodes, self.step_count()))

    def actor_gone(self) -> None:
        """The actor process ended: keep the steps it took."""
        self.actor.wait()
        path = self.step_count()
        self.taken.append(int(path.read_text()) if path.exists() else 0)

    def episodes_logged(self) -> int:
        return len(load_episodes(self.episodes))

    def steps_logged(self) -> int:
        rows = load_episodes(self.episodes)
        return rows[-1]["steps"] if rows else 0

    def wait_for_steps(self, steps: int, timeout_s: float = 1800) -> None:
        deadline = time.monotonic() + timeout_s
        while self.steps_logged() < steps:
            for proc in (self.learner, self.actor):
                if proc.poll() is not None:
                    raise RuntimeError(f"{self.name}: {proc.args[3:5]} exited {proc.returncode} before step {steps}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no step {steps} in {timeout_s} s")
            time.sleep(0.5)

    def until(self, condition, timeout_s: float) -> float | None:
        """Seconds until ``condition()``, or None past ``timeout_s`` (hung)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if condition():
                return round(time.monotonic() - started, 2)
            time.sleep(0.1)
        return None

    def learner_name(self) -> str:
        return "learner" if not self.fresh else f"learner-fresh{self.fresh}"

    def restarted_learner(self) -> dict:
        """Start the learner again with its resume flag: seconds until it took the actor's steps again;
        where it did not (it failed: the exception its log ends with; or no actor's rows came within
        ``recover_s``), why, and a fresh start in a new directory, as a user would."""
        recover_s = self.learner_recovered(resume=True)
        failure = self.learner_failure()
        if failure is None and recover_s is not None:
            return {"recover_s": recover_s}
        stayed_up = self.learner.poll() is None
        if stayed_up:  # up, but failed inside (or silent): stopped, as a user would
            self.learner.kill()
            self.learner.wait()
        self.fresh += 1
        return {"recover_s": None, "not_recovered": failure or "it took no rows from the actor within recover_s",
                "learner_process_stayed_up": failure is not None and stayed_up,
                "fresh_start_recover_s": self.learner_recovered(resume=False)}

    def on_disk(self) -> dict:
        """What the learner's files hold after it stopped, where the system's replay is only there at
        its checkpoints (LeRobot's); nothing to add where the replay commits as it takes rows."""
        return {}

    def learner_failure(self) -> str | None:
        """The exception the learner's log ends a traceback with, if it has one, or why it exited."""
        lines = self.learner_log_path().read_text(errors="replace").splitlines()
        if any(line.startswith("Traceback") for line in lines):
            errors = [line for line in lines if line and not line[0].isspace() and "Error" in line.split(":")[0]]
            return (errors[-1] if errors else lines[-1])[-300:]
        if self.learner.poll() is not None:
            return f"exited {self.learner.returncode}"
        return None

    def actor_recovered(self) -> float | None:
        """Start the actor; seconds to its first episode."""
        before = self.episodes_logged()
        self.start_actor()
        return self.until(lambda: self.episodes_logged() > before, self.faults.recover_s)


class Embodyrl(Side):
    name = "embodyrl"

    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.faults.port}"

    def learner_command(self, resume: bool) -> list[str]:
        steps = 4 * self.faults.every + self.faults.tail + 10_000  # the harness stops it, as LeRobot's
        return [str(self.python), "-m", "embodyrl.cli", "learner", TASK, "--run-dir", str(self.folder()),
                "--bind", self.endpoint(), "--steps", str(steps), "--seed", str(self.faults.seed),
                "--demos", str(self.root / "demos"), *embodyrl_settings(self.plan),
                "--learner.checkpoint_every_s", str(self.faults.checkpoint_every_s),
                *(["--resume"] if resume else [])]

    def folder(self) -> Path:
        return self.run / self.learner_name()

    def learner_log_path(self) -> Path:
        return self.run / "learner.log"

    def actor_command(self) -> list[str]:
        return [str(self.python), "-m", "embodyrl.cli", "actor", TASK, "--connect", self.endpoint(), "--config",
                str(self.folder() / "config.json"), "--teleop", PERSON, "--seed", str(self.faults.seed),
                "--log-dir", str(self.folder())]

    def start_learner(self, resume: bool = False) -> None:
        self.learner = subprocess.Popen(niced(self.learner_command(resume)), cwd=self.run,
                                        stdout=self.log("learner"), stderr=subprocess.STDOUT, env=environ())
        self.until(lambda: (self.folder() / "config.json").exists(), 120)

    def replay(self) -> dict:
        proc = subprocess.run([str(self.python), "-m", "embodyrl.cli", "replay", str(self.folder()), "--json"],
                              capture_output=True, text=True, env=environ())
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def actor_rows(self) -> int:
        return sum(n for actor, n in self.replay().get("rows_by_actor", {}).items() if int(actor) >= 0)

    def in_checkpoint(self) -> bool:
        folder = self.folder() / "checkpoints"
        return folder.exists() and any("tmp" in entry.name for entry in folder.iterdir())

    def learner_recovered(self, resume: bool = True) -> float | None:
        before = self.actor_rows()
        self.start_learner(resume)
        return self.until(lambda: self.actor_rows() > before or self.learner_failure() is not None,
                          self.faults.recover_s)

    def final_rows(self) -> int | None:
        """Stop the learner; the environment steps it holds, by its own count (the counters line it
        prints on the way out; the replay's rows add one closing row per finished episode)."""
        self.learner.send_signal(signal.SIGINT)
        self.learner.wait(timeout=300)
        counters = [json.loads(line) for line in self.learner_log_path().read_text(errors="replace").splitlines()
                    if line.startswith('{"env_steps"')]
        return counters[-1]["env_steps"] if counters else None


class LeRobot(Side):
    name = "lerobot"

    def __init__(self, *args, bounds: dict):
        super().__init__(*args)
        self.bounds = bounds
        self.learner_starts = 0

    def config(self, who: str) -> Path:
        plan = Plan(**{**asdict(self.plan), "port": self.faults.port, "steps": 10**6, "seeds": (self.faults.seed,),
                       "save_every": self.faults.lerobot_save_every})
        return lerobot_config(self.run, who, self.faults.seed, plan, self.bounds, self.root / "demos")

    def actor_command(self) -> list[str]:
        config = self.config(f"actor{self.actor_starts}")  # LeRobot refuses an existing output directory
        return [str(self.python), str(REPO / "examples" / "hilserl_lerobot_actor.py"), "--config_path", str(config)]

    def learner_log_path(self) -> Path:
        return self.run / f"learner{self.learner_starts}.log"

    def start_learner(self, resume: bool = False) -> None:
        self.learner_starts += 1
        config = self.config(self.learner_name())
        if resume:  # LeRobot resumes from the config its last checkpoint saved, named as --config_path=PATH
            config = self.run / self.learner_name() / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
        command = [str(self.python), "-m", "lerobot.rl.learner", f"--config_path={config}",
                   *(["--resume=true"] if resume else [])]
        self.learner = subprocess.Popen(niced(command), cwd=self.run, stdout=self.learner_log_path().open("w"),
                                        stderr=subprocess.STDOUT, env=environ())

    def learner_says(self, text: str) -> int:
        path = self.learner_log_path()
        return path.read_text(errors="replace").count(text) if path.exists() else 0

    def in_checkpoint(self) -> bool:
        return self.learner_says("Checkpoint policy after step") > self.learner_says("Resume training")

    def learner_recovered(self, resume: bool = True) -> float | None:
        self.start_learner(resume)
        return self.until(lambda: self.learner_says("Received request to receive transitions from the Actor") > 0
                          or self.learner_failure() is not None, self.faults.recover_s)

    def on_disk(self) -> dict:
        return {"replay_rows_on_disk": self.replay_frames()}

    def replay_frames(self) -> int | None:
        info = self.run / self.learner_name() / "dataset" / "meta" / "info.json"
        try:
            return int(json.loads(info.read_text())["total_frames"])
        except (OSError, ValueError, KeyError):
            return None

    def final_rows(self) -> int | None:
        """The replay LeRobot's learner writes at its next checkpoint after the last actor stopped."""
        done = self.learner_says("Resume training")
        self.until(lambda: self.learner_says("Resume training") > done or self.learner_failure() is not None, 600)
        return self.replay_frames()


def ctrl_c_in_checkpoint(side: Side) -> dict:
    """Two SIGINTs to the learner while it writes a checkpoint; whether one was being written then."""
    caught = side.until(side.in_checkpoint, 300) is not None
    side.learner.send_signal(signal.SIGINT)
    time.sleep(0.3)
    if side.learner.poll() is None:
        side.learner.send_signal(signal.SIGINT)
    side.learner.wait(timeout=120)
    return {"during_checkpoint": caught, "learner_exit": side.learner.returncode}


def run_faults(side: Side) -> dict:
    """:func:`faults` on ``side``; whatever happens, no process of it outlives the call."""
    try:
        return faults(side)
    finally:
        for proc in (side.actor, side.learner):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def faults(side: Side) -> dict:
    f = side.faults
    events = {}
    side.start_learner()
    side.start_actor()
    side.wait_for_steps(f.every)
    side.actor.kill()
    side.actor_gone()
    events["actor_sigkill"] = {"recover_s": side.actor_recovered()}
    side.wait_for_steps(2 * f.every)
    events["learner_ctrl_c_in_checkpoint"] = {**ctrl_c_in_checkpoint(side), **side.on_disk(),
                                              **side.restarted_learner()}
    side.wait_for_steps(3 * f.every)
    side.actor.send_signal(signal.SIGINT)
    side.actor_gone()
    events["actor_restart"] = {"recover_s": side.actor_recovered()}
    side.wait_for_steps(4 * f.every)
    side.learner.send_signal(signal.SIGINT)
    side.learner.wait(timeout=300)
    events["learner_restart"] = {"learner_exit": side.learner.returncode, **side.restarted_learner()}
    side.wait_for_steps(4 * f.every + f.tail)
    side.actor.send_signal(signal.SIGINT)
    side.actor_gone()
    rows = side.final_rows()
    if side.learner.poll() is None:
        side.learner.send_signal(signal.SIGINT)
        try:
            side.learner.wait(timeout=120)
        except subprocess.TimeoutExpired:
            side.learner.kill()
    taken = sum(side.taken)
    return {"system": side.name, "faults": events, "steps_taken": taken, "steps_by_actor_process": side.taken,
            "rows_held_at_end": rows, "rows_lost": None if rows is None else taken - rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--venv", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sides", default="embodyrl,lerobot")
    args = parser.parse_args(argv)
    plan, faults = (Plan.quick(), FaultPlan.quick()) if args.quick else (Plan(), FaultPlan())
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    python = venv_python((args.venv or root / "venv").resolve())
    record_demos(python, root, plan)
    out = root / "faults.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    for name in args.sides.split(","):
        if name in results:
            continue
        side = (Embodyrl(python, root, plan, faults) if name == "embodyrl"
                else LeRobot(python, root, plan, faults, bounds=observation_bounds(python)))
        result = {**run_faults(side), "plan": asdict(faults)}
        # read again: another invocation (the other system's) may have written its result meanwhile
        results = {**(json.loads(out.read_text()) if out.exists() else {}), name: result}
        out.write_text(json.dumps(results, indent=2))
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
