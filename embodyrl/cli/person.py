"""The person in the loop of an actor process: the teleop source, the operator, the screen.

An actor process (``embodyrl actor``, or each actor of ``embodyrl train``)
builds these from ``actor.teleop`` and the reset mode (``actor.reset``, or a
robot file's ``reset: operator``):

* the teleop source (:func:`embodyrl.hal.teleop.make_source`) drives the
  run's first device (device id 0);
* with ``reset: operator``, a :class:`~embodyrl.hal.operator.TerminalOperator`
  asks at the end of each episode, on the terminal the keyboard source reads
  (one reader per terminal), else on standard input or the controlling
  terminal.

In ``embodyrl train`` every actor shares one terminal, so only actor 0 takes
the keyboard or asks the operator; a train of several actors with either is
refused by the others. Scripts and input devices may drive every actor.
"""

from __future__ import annotations

import multiprocessing
import os
import sys


class PersonRefused(ValueError):
    """A person's part that this actor cannot take (several actors of one train at one terminal)."""


def _terminal_fd() -> int:
    """Standard input if it is a terminal, else the controlling terminal, else standard input (a
    pipe: scripted answers)."""
    if os.isatty(0):
        return 0
    try:
        return os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return 0


def reset_mode(config) -> str:
    """``operator`` if the actor config or the run's robot says so, else ``auto``."""
    if config.actor.reset == "operator":
        return "operator"
    from ..robot import of_config

    return of_config(config).reset


def at_terminal(config) -> bool:
    """Whether a person answers at this terminal (the keyboard source or ``reset: operator``): the
    live panel would redraw over their prompts, so ``train`` prints plain progress lines instead."""
    return _answers_at_terminal(config.actor.teleop, reset_mode(config))


def _answers_at_terminal(teleop: str, reset: str) -> bool:
    return teleop == "keyboard" or reset == "operator"


def needs_real_pace(config) -> bool:
    """Whether a person drives or answers (a keyboard, gamepad or spacemouse; ``reset: operator``):
    then the actor runs at the device's real pace. A ``script:`` source is no person: the actor
    keeps ``actor.realtime`` (a simulator waits for the learner's credit)."""
    teleop = config.actor.teleop
    return reset_mode(config) == "operator" or (bool(teleop) and not teleop.startswith("script:"))


def person_parts(config, group, index: int):
    """(teleop sources by member name or None, operator or None) of actor ``index`` of a run of
    ``config``; one it cannot make is said on stderr and ends the process with exit code 2."""
    from ..hal.teleop import TeleopError

    try:
        return _person_parts(config.actor.teleop, reset_mode(config), group, index)
    except (TeleopError, PersonRefused) as err:
        print(f"embodyrl: actor {index}: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def _person_parts(teleop: str, reset: str, group, index: int):
    from ..hal.intervention import KeyboardTeleop
    from ..hal.operator import TerminalOperator
    from ..hal.teleop import make_source

    if _answers_at_terminal(teleop, reset) and index > 0 and multiprocessing.parent_process() is not None:
        raise PersonRefused("a person at one terminal attends one actor of embodyrl train: train with "
                            "--actors 1, or start each robot's actor with embodyrl actor")
    sources = None
    keys = None
    if teleop:
        first = min(group.members, key=lambda m: m.device_id)
        source = make_source(teleop, first.device.action_spec)
        sources = {first.name: source}
        if isinstance(source, KeyboardTeleop):
            keys = source.other_keys
    operator = TerminalOperator(_terminal_fd(), keys=keys) if reset == "operator" else None
    return sources, operator


def close_parts(sources, operator) -> None:
    from ..hal.teleop import close_source

    for source in (sources or {}).values():
        close_source(source)
    if operator is not None:
        operator.close()


class LearnerNews:
    """Says on stderr when the learner goes and comes back (fed the actor's report snapshots)."""

    def __init__(self, index: int, policies, stream=None):
        self.index, self.policies = index, policies
        self.stream = stream
        self.state = "connected"

    def __call__(self, snapshot: dict) -> None:
        state = snapshot.get("learner", "connected")
        if state == self.state:
            return
        self.state = state
        spooled = snapshot.get("link", {}).get("spool_rows", 0)
        if state == "gone":
            versions = {tuple(p.version) for p in self.policies.values()}
            if all(v[1] < 0 for v in versions):
                acting = "no weights yet: the devices hold their safe state (a person may still take over)"
            else:
                acting = f"acting with its last weights {sorted(versions)[-1]}"
            text = f"the learner is gone; {acting}; spooling ({spooled} rows so far)"
        else:
            text = f"the learner is back; {spooled} spooled rows to deliver"
        print(f"embodyrl: actor {self.index}: {text}", file=self.stream or sys.stderr, flush=True)
