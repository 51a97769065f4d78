"""Every command in the docs' code blocks runs (long ones on a tiny budget), so the docs cannot rot.

The commands are the lines (or ``&&`` parts) of fenced shell code blocks in
README.md and docs/*.md that start with ``embodyrl `` or ``python examples/``.
Each one is first checked in this process: it parses with the real parser,
names a known task, benchmark or example, and its config (YAML file and
overrides) validates. Then it runs, in document order, in one scratch
directory, unless ``RULES`` says why it cannot run here; ``RULES`` also
turns long runs into their tiny-budget form. A ```yaml block is written to
the scratch directory under the last ``NAME.yaml`` its text mentions, so a
command may use the file the page shows.
"""

from __future__ import annotations

import glob
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_helpers import in_process

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PREFIXES = ("embodyrl ", "python examples/", "python3 examples/")
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
"""Code blocks read for commands (a ```text or ```yaml block is a picture or a file, not commands)."""

TINY_TRAIN = ("--steps", "300", "--eval_episodes", "1", "--ddpg.hidden_sizes", "[16, 16]",
              "--sac.hidden_sizes", "[16, 16]", "--learner.min_replay", "150", "--actor.random_steps", "150",
              "--quiet")
"""Appended to a ``train`` command (later flags win): a few hundred steps with small networks."""


@dataclass(frozen=True)
class Rule:
    pattern: str
    """Regular expression matched against the command (comments stripped)."""
    append: tuple[str, ...] = ()
    """Arguments appended to make it a tiny-budget run."""
    skip: str = ""
    """Why it does not run here (it is still checked); empty: it runs."""
    replace: tuple[tuple[str, str], ...] = ()
    """(text, substitute) pairs applied before the command is checked and run: the hardware or
    the person it needs, replaced by a simulation or a script."""


ON_THE_SIMULATED_ARM = (("arm.yaml", "arm_local.yaml"), ("--teleop keyboard", "--teleop script:robot_helpers:hold"))
"""docs/robots.md's arm behind a robot server and the person at the keyboard: the same arm built in
this process (examples/robots/arm_local.yaml) and a script (tests/robot_helpers.py), copied beside
the commands. tests/test_robot_file.py trains arm.yaml itself through a robot server with keys."""

RULES = [
    Rule(r"^embodyrl train arm\.yaml .*--resume", replace=ON_THE_SIMULATED_ARM,
         skip="a second training run; tests/test_robot_file.py resumes a robot file's run and refuses a "
              "changed file"),
    Rule(r"^embodyrl record arm\.yaml ", replace=ON_THE_SIMULATED_ARM,
         append=("--episodes", "2", "--episode-steps", "50", "--unpaced")),
    Rule(r"^embodyrl train arm\.yaml ", replace=ON_THE_SIMULATED_ARM, append=TINY_TRAIN),
    Rule(r"^embodyrl (robot-server|record) examples/robots/so101", skip="an SO-101 arm and LeRobot: "
         "tests/test_lerobot_real.py serves, records and trains LeRobot's own classes on the simulated arm, "
         "tests/test_lerobot.py the same through the simulated follower"),
    Rule(r"^embodyrl console ", skip="the console serves until stopped; tests/test_console_api.py and "
                                      "tests/test_console_browser.py run it as a process with live actors"),
    Rule(r"^embodyrl bench ", skip="each benchmark runs with quick=True in tests/test_bench_*.py and "
                                    "tests/test_chaos.py; full sizes take minutes"),
    Rule(r"^embodyrl (learner|actor) ", skip="learner and actors run at once on two machines; "
         "tests/test_cli_learner_actor.py and tests/test_cli_security.py run them as concurrent processes"),
    Rule(r"^embodyrl launch (ray|slurm) ", skip="a Ray or Slurm cluster: tests/test_launch_ray.py and "
         "tests/test_launch_slurm.py start real ones on this machine (slow), the dry run's scripts pass "
         "sbatch --test-only in the default suite"),
    Rule(r"^embodyrl launch local ", append=TINY_TRAIN),
    Rule(r"^python3? examples/", skip="tests/test_examples.py runs every example on its tiny budget"),
    Rule(r"^embodyrl record .*--teleop (keyboard|gamepad|spacemouse)", skip="a person at an input device; "
         "tests/test_record.py records with a scripted source, tests/test_operator_reset.py answers at a pty"),
    Rule(r"^embodyrl reward train ", skip="the page's arm has no camera; tests/test_reward_classifier.py trains a "
                                          "success classifier through this command on recorded camera frames"),
    Rule(r"^embodyrl demos ", skip="summarises what a recording by a person wrote; tests/test_record.py "
                                   "runs it on a recorded directory"),
    Rule(r"^embodyrl train pendulum$", skip="the default run of the README's two commands; the quickstart's "
                                           "embodyrl train pendulum --run-dir runs/pendulum runs here"),
    Rule(r"^embodyrl train gym:", skip="tests/test_cli_tasks.py::test_train_a_gymnasium_id trains a Gymnasium id"),
    Rule(r"^embodyrl train .*--config ", skip="one more training run; tests/test_cli_commands.py trains from a "
                                             "YAML file plus overrides (the file and overrides are checked here)"),
    Rule(r"^embodyrl train examples/robots/", skip="one more training run; tests/test_robot_file.py trains a robot "
                                                 "file, a module:factory and a robot behind a robot server"),
    Rule(r"^embodyrl train .*--synchronous", skip="one more training run; tests/test_sync_path.py trains the "
                                                 "synchronous loop and checks what it writes"),
    Rule(r"^embodyrl train .*--eval_every ", skip="one more training run; tests/test_train_cli.py trains with "
                                                 "--eval_every and checks the snapshots' evaluations"),
    Rule(r"^embodyrl train ", append=TINY_TRAIN),
]


def _commands() -> list[tuple[str, str]]:
    """(page, command) in document order, duplicates dropped."""
    found, seen = [], set()
    for page in PAGES:
        for block in re.finditer(r"^```([^\n]*)\n(.*?)^```", page.read_text(), re.S | re.M):
            if block.group(1).strip() not in SHELL_BLOCKS:
                continue
            for line in block.group(2).splitlines():
                for part in line.split("&&"):
                    part = part.strip().removeprefix("$ ")
                    if not part.startswith(PREFIXES):
                        continue
                    command = shlex.join(shlex.split(part, comments=True))
                    if command not in seen:
                        seen.add(command)
                        found.append((page.relative_to(ROOT).as_posix(), command))
    return found


def _yaml_files() -> dict[str, str]:
    """NAME.yaml -> the ```yaml block that follows its last mention."""
    files = {}
    for page in PAGES:
        text = page.read_text()
        for block in re.finditer(r"^```ya?ml\n(.*?)^```", text, re.S | re.M):
            names = re.findall(r"`([\w.-]+\.ya?ml)`", text[:block.start()])
            if names:
                files[names[-1]] = block.group(1)
    return files


def _rule(command: str) -> Rule | None:
    return next((r for r in RULES if re.search(r.pattern, command)), None)


def _replaced(command: str) -> str:
    rule = _rule(command)
    for text, substitute in rule.replace if rule else ():
        command = command.replace(text, substitute)
    return command


def _check(command: str, scratch: Path) -> None:
    """Parse with the real parser; known task or robot, benchmark or example; the config validates."""
    from embodyrl import bench, robot
    from embodyrl.cli.commands import _overrides, build_parser
    from embodyrl.config import build_config, default_config

    argv = shlex.split(command)
    if argv[0].startswith("python"):
        example = ROOT / argv[1]
        assert example.is_file(), f"{argv[1]} does not exist"
        return
    args, extra = build_parser().parse_known_args(argv[1:])
    if args.command == "bench":
        assert args.name in bench.names(), f"unknown benchmark {args.name!r}"
    source = {"record": "robot", "train": "task", "learner": "task", "actor": "task"}.get(args.command)
    if source is not None:  # any form; a robot file is refused here naming the field
        name = getattr(args, source)
        robot.load(str(scratch / name) if robot.is_file(name) else name)
    if args.command in ("train", "learner", "actor"):
        yaml = scratch / args.config if args.config and (scratch / args.config).is_file() else None
        if args.config and args.config.endswith((".yaml", ".yml")):
            assert yaml is not None, f"{args.config}: the page shows no such file"
        build_config(default_config(args.task), yaml, _overrides(extra))
    else:
        assert not extra, f"unrecognized arguments {extra}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    directory = tmp_path_factory.mktemp("docs")
    for name, text in _yaml_files().items():
        (directory / name).write_text(text)
    for path in (ROOT / "examples" / "robots" / "arm_local.yaml", ROOT / "tests" / "robot_helpers.py"):
        (directory / path.name).write_bytes(path.read_bytes())  # what ON_THE_SIMULATED_ARM runs
    (directory / "examples").mkdir()
    shutil.copytree(ROOT / "examples" / "robots", directory / "examples" / "robots")  # as from the repository
    return directory


COMMANDS = _commands()
IN_PROCESS = ("keys", "replay", "plot", "eval", "export", "tasks", "demos")
"""Commands that start no other process: run through the command's own ``main`` in this process
(:func:`tests.cli_helpers.in_process`), without a second import of JAX each; the rest (``train``,
``launch``, ``record`` with its robot) run as the user types them, in a subprocess."""


def test_the_docs_show_commands():
    pages = {page for page, _ in COMMANDS}
    assert {"README.md", "docs/cli.md", "docs/running_across_machines.md", "docs/robots.md"} <= pages
    assert any(c.startswith("embodyrl train ") for _, c in COMMANDS)


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}: {c}" for p, c in COMMANDS])
def test_docs_command(page, command, scratch):
    rule = _rule(command)
    command = _replaced(command)
    _check(command, scratch)
    if rule is not None and rule.skip:
        pytest.skip(f"checked, not run: {rule.skip}")
    argv = shlex.split(command) + list(rule.append if rule else ())
    argv = [m for a in argv for m in (sorted(glob.glob(a, root_dir=scratch)) or [a] if "*" in a else [a])]
    if argv[0] == "embodyrl" and argv[1] in IN_PROCESS:
        proc = in_process(*argv[1:], cwd=scratch)
    else:
        proc = subprocess.run([sys.executable, "-m", "embodyrl.cli", *argv[1:]], cwd=scratch, capture_output=True,
                              text=True, timeout=240)
    assert proc.returncode == 0, f"{page}: {command}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
