"""The live training display: rich panel, plain lines, quiet, and the choice between them."""

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest
from rich.console import Console

from embodyrl.cli.display import FIELDS, Display, MetricsFollower, resolve_mode

RECORD = {"time": 12.5, "env_steps": 1500, "episodes": 7, "episode_return": -812.25, "updates": 900,
          "updates_per_s": 142.0, "policy_version": 29, "replay_size": 1500, "actors": 2, "policy_lag": 1.75,
          "policy_age": 93.4}


def _write(path, *records, tail=""):
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write(tail)


def test_follower_reads_only_complete_lines_and_keeps_the_last_return(tmp_path):
    path = tmp_path / "metrics.jsonl"
    follower = MetricsFollower(path)
    assert not follower.poll()  # no file yet: nothing, no error
    _write(path, RECORD, tail='{"env_steps": 16')  # the learner is mid-line
    assert follower.poll() and follower.latest["env_steps"] == 1500
    _write(path, tail='00, "episode_return": null}\n')
    assert follower.poll()
    assert follower.latest == {"env_steps": 1600, "episode_return": None}
    assert follower.last_return == -812.25  # an interval without episodes does not erase it
    assert not follower.poll()


def test_live_panel_shows_every_field(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, RECORD)
    console = Console(file=io.StringIO(), force_terminal=True, width=100, record=True)
    with Display(path, 3000, "live", console=console) as display:
        display.show(force=True)
    text = console.export_text()
    for label in FIELDS:
        assert label in text
    for value in ("1,500 / 3,000 (50%)", "-812.2", "142", "1.75", "29"):
        assert value in text
    assert "━" in text  # the progress bar


def test_plain_mode_prints_lines_and_quiet_prints_nothing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, RECORD)
    out = io.StringIO()
    with Display(path, 3000, "plain", stream=out) as display:
        display.show(force=True)
        display.show()  # within every_s: no second line
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "env steps 1,500 / 3,000 (50%)" in lines[0] and "policy lag 1.75" in lines[0]
    assert "policy age 93 updates" in lines[0]
    quiet = io.StringIO()
    with Display(path, 3000, "quiet", stream=quiet) as display:
        display.show(force=True)
    assert quiet.getvalue() == ""


def test_auto_is_live_only_on_a_terminal():
    master, slave = pty.openpty()
    try:
        with os.fdopen(os.dup(slave), "w") as tty:
            assert resolve_mode("auto", tty, tty) == "live"
            assert resolve_mode("auto", io.StringIO(), tty) == "plain"  # stdout redirected
    finally:
        os.close(master)
        os.close(slave)
    with pytest.raises(ValueError, match="display mode 'fancy'"):
        Display("m.jsonl", 1, "fancy")


def _read_until_exit(proc, master, timeout_s):
    """Everything the child writes to the terminal, until it exits (or the timeout)."""
    chunks, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every process holding the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    return b"".join(chunks).decode(errors="replace")


def test_train_in_a_terminal_draws_the_panel(tmp_path):
    """``embodyrl train`` in a pseudo-terminal: the live panel, with its fields, reaches the screen.

    The same run exercises ``--curve``: its learner-actor link runs over CurveZMQ with fresh keys.
    """
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "110", "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "embodyrl.cli", "train", "pendulum", "--steps", "500", "--run-dir",
         str(tmp_path / "run"), "--eval_episodes", "1", "--sac.hidden_sizes", "[16, 16]",
         "--learner.min_replay", "200", "--learner.log_every_s", "0.3", "--actor.random_steps", "200", "--curve"],
        stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    try:
        screen = _read_until_exit(proc, master, 240)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        os.close(master)
    assert proc.returncode == 0, screen[-3000:]
    for label in FIELDS:
        assert label in screen, label
    assert re.search(r"\d[\d,]* / 500 \(1\d\d%\)", screen)  # the last frame stays on screen
    assert "\x1b[" in screen  # drawn with terminal control codes, not plain lines
    keys = tmp_path / "run" / "keys"
    assert (keys / "learner" / "learner.key_secret").exists() and (keys / "authorized" / "actor.key").exists()
