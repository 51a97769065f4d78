"""The exit codes docs/cli.md promises, and --help that documents every option of every command."""

import argparse
import subprocess
import sys

import pytest

from embodyrl.cli.commands import build_parser
from embodyrl.replay.layout import META_FILE
from tests.cli_helpers import in_process


def _cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "embodyrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_and_option_has_help_and_the_commands_name_their_exit_codes():
    parser = build_parser()
    commands = _subcommands(parser)
    assert {"train", "learner", "actor", "eval", "replay", "plot", "bench", "keys", "tasks"} <= set(commands)
    for name, sub in commands.items():
        text = sub.format_help()
        assert sub.description, f"embodyrl {name} has no description"
        assert "exit codes" in text.lower(), f"embodyrl {name} --help does not name its exit codes"
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"embodyrl {name}: {action.option_strings or action.dest} has no help"
    assert "exit codes" in parser.format_help().lower()


def test_help_exits_0_and_no_command_exits_2():
    assert in_process("--help").returncode == 0
    assert in_process("train", "--help").returncode == 0
    nothing = in_process()
    assert nothing.returncode == 2 and "command" in nothing.stderr


def test_unknown_benchmark_is_2_and_names_the_known_ones():
    out = in_process("bench", "nosuch")
    assert out.returncode == 2 and "unknown benchmark 'nosuch'" in out.stderr and "transport" in out.stderr


def test_a_corrupt_replay_is_1(tmp_path):
    replay = tmp_path / "replay"
    replay.mkdir()
    (replay / META_FILE).write_text('{"format": "not ours"}')
    out = in_process("replay", str(tmp_path))
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("embodyrl: replay: ") and META_FILE in out.stderr


@pytest.mark.parametrize("bind", ["ipc:///nonexistent-dir/embodyrl.sock"])
def test_a_learner_that_fails_is_1_and_every_process_stops(bind, tmp_path):
    """The learner cannot bind: train reports the failure (exit 1), not a hang."""
    out = _cli("train", "pendulum", "--learner.bind", bind, "--run-dir", str(tmp_path / "run"), "--quiet")
    assert out.returncode == 1, out.stderr
    assert "embodyrl: training failed" in out.stderr and "nonexistent-dir" in out.stderr
