"""A person at the end of each episode: reset the scene by hand, then say how it went.

With ``reset: operator`` a loop that reaches the end of an episode holds
the device in its safe state and asks an :class:`Operator`::

    operator.ask(device_id, summary)        # e.g. print the prompt
    while (answer := operator.answer()) is None:
        hold the safe action, keep the link alive
    label = answer.success                  # True, False, or None (go: the task decides)

The answers are keys: ``g`` go (the scene is reset; the task's own success
signal stands), ``s`` success, ``f`` failure. :class:`TerminalOperator`
reads them from a terminal (or a pipe), :class:`ScriptedOperator` from a
list, for tests.

A label reaches the learner on the episode's last acted row
(:func:`apply_label`): success makes it ``terminated`` (nothing to
bootstrap past a solved task), failure makes it ``truncated`` (the episode
was cut short; the learner bootstraps through it, as at a time limit). A
task that pays for success, ``success_reward`` (a float attribute, as a
sparse HIL-SERL-style task has), also gets that row's reward set: the value
on success, 0 on failure. A dense task's rewards are left as they are.
"""

from __future__ import annotations

import contextlib
import enum
import os
import queue
import select
import sys
import time
from collections.abc import Callable, Iterable
from typing import Protocol, TextIO, runtime_checkable

import numpy as np


class Answer(enum.Enum):
    """What the person says at the end of an episode."""

    GO = "g"
    SUCCESS = "s"
    FAILURE = "f"

    @property
    def success(self) -> bool | None:
        """The label: True, False, or None (go: no label of the person's)."""
        return {Answer.GO: None, Answer.SUCCESS: True, Answer.FAILURE: False}[self]


class OperatorGone(RuntimeError):
    """No one can answer: the operator's input closed."""


@runtime_checkable
class Operator(Protocol):
    def ask(self, device_id: int, summary: str, *, allow_go: bool = True) -> None:
        """Show that the episode ended (``summary``) and what to answer; ``allow_go``: whether
        ``g`` is accepted (not where the task has no success signal of its own)."""

    def answer(self) -> Answer | None:
        """The person's answer once given, else None; never blocks."""


def apply_label(task, success: bool | None, reward: float, terminated: bool,
                truncated: bool) -> tuple[float, bool, bool]:
    """(reward, terminated, truncated) of an episode's last acted row once the person labelled it
    (``success`` None: unchanged). See the module docstring for the rule."""
    if success is None:
        return reward, terminated, truncated
    paid = getattr(task, "success_reward", None)
    if paid is not None:
        reward = float(paid) if success else 0.0
    return reward, success, not success


def task_success(task, observations: list[dict[str, np.ndarray]]) -> bool | None:
    """The task's own success signal for a finished episode: ``episode_metrics(...)["success"]``
    where the task reports one, else None (the task cannot tell)."""
    if not observations:
        return None
    value = task.episode_metrics(observations).get("success")
    return None if value is None else bool(value)


def wait_for_answer(operator: Operator, summary: str, *, allow_go: bool = True,
                    every: Callable[[], None] = lambda: None, period_s: float = 0.05,
                    should_stop: Callable[[], bool] = lambda: False, device_id: int = 0) -> Answer | None:
    """Ask, then call ``every`` (hold the safe action, keep a link alive) once per ``period_s``
    until the answer comes; None if ``should_stop()`` first."""
    operator.ask(device_id, summary, allow_go=allow_go)
    while not should_stop():
        answer = operator.answer()
        if answer is not None:
            return answer
        every()
        time.sleep(period_s)
    return None


PROMPT = ("{summary}\n  reset the scene, then press {keys}\n")


def prompt_keys(allow_go: bool) -> str:
    choices = ["g (go)"] if allow_go else []
    return ", ".join([*choices, "s (success)", "f (failure)"])


class TerminalOperator:
    """Answers typed at a terminal: one key, no Enter needed (a pipe's characters work too).

    Reads ``fd`` itself (standard input by default), or ``keys``, a queue another reader of the
    same terminal fills (a :class:`~.intervention.KeyboardTeleop`'s ``other_keys``): one reader
    per terminal. Prompts go to ``out`` (standard error). On a terminal, keys typed before the
    prompt are discarded, so a key pressed during the episode never answers it.
    """

    def __init__(self, fd: int | None = None, *, keys: queue.SimpleQueue | None = None,
                 out: TextIO | None = None):
        self._fd = 0 if fd is None else fd
        self._keys = keys
        self._out = out
        self._buffer = ""
        self._allow_go = True
        self._saved_tty = None
        self._closed = False

    @property
    def _stream(self) -> TextIO:
        return self._out or sys.stderr

    def ask(self, device_id: int, summary: str, *, allow_go: bool = True) -> None:
        self._allow_go = allow_go
        tty = self._keys is None and os.isatty(self._fd)
        if self._keys is not None:
            while True:  # keys typed during the episode are not answers
                try:
                    self._keys.get_nowait()
                except queue.Empty:
                    break
        elif tty:
            import termios

            termios.tcflush(self._fd, termios.TCIFLUSH)
            self._buffer = ""
            if self._saved_tty is None:
                import tty as tty_mode

                self._saved_tty = termios.tcgetattr(self._fd)
                tty_mode.setcbreak(self._fd)
        self._stream.write(PROMPT.format(summary=summary, keys=prompt_keys(allow_go)))
        self._stream.flush()

    def answer(self) -> Answer | None:
        for key in self._take():
            try:
                answer = Answer(key.lower())
            except ValueError:
                continue
            if answer is Answer.GO and not self._allow_go:
                self._stream.write("  the task has no success signal: press s or f\n")
                self._stream.flush()
                continue
            self._stream.write(f"  {answer.name.lower()}\n")
            self._stream.flush()
            self._restore()
            return answer
        return None

    def _take(self) -> Iterable[str]:
        """Characters typed since the last look (kept, past an answer, for the next prompt)."""
        if self._keys is not None:
            while True:
                try:
                    yield self._keys.get_nowait()
                except queue.Empty:
                    return
        if not self._buffer and not self._closed and select.select([self._fd], [], [], 0)[0]:
            data = os.read(self._fd, 64)
            if not data:
                self._closed = True
            self._buffer += data.decode(errors="ignore")
        if self._closed and not self._buffer:
            raise OperatorGone("the operator's input closed with no answer (run it at a terminal)")
        while self._buffer:
            key, self._buffer = self._buffer[0], self._buffer[1:]
            yield key

    def _restore(self) -> None:
        if self._saved_tty is not None:
            import termios

            with contextlib.suppress(termios.error):
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved_tty)
            self._saved_tty = None

    def close(self) -> None:
        self._restore()


class ScriptedOperator:
    """Answers from a list, one per episode (for tests); ``asked`` keeps the summaries."""

    def __init__(self, answers: Iterable[str | Answer]):
        self._answers = [a if isinstance(a, Answer) else Answer(a) for a in answers]
        self.asked: list[tuple[int, str]] = []

    def ask(self, device_id: int, summary: str, *, allow_go: bool = True) -> None:
        self.asked.append((device_id, summary))

    def answer(self) -> Answer | None:
        if not self._answers:
            raise OperatorGone("the scripted operator has no answer left")
        return self._answers.pop(0)


class ConsoleAnswers:
    """Answers given at the operator console (``embodyrl console``): the prompt waiting, and
    the answer once the console's command gave one."""

    def __init__(self):
        self.prompt: dict | None = None
        """``{"device_id", "summary", "allow_go"}`` while a device waits for its answer."""
        self._given: Answer | None = None

    def ask(self, device_id: int, summary: str, *, allow_go: bool = True) -> None:
        self.prompt = {"device_id": device_id, "summary": summary, "allow_go": allow_go}
        self._given = None

    def give(self, device_id: int, answer: Answer) -> str:
        """Take the console's answer for ``device_id``; the reason it cannot ('' if it can)."""
        if self.prompt is None or self.prompt["device_id"] != device_id:
            return f"device {device_id} is not waiting for an answer"
        if answer is Answer.GO and not self.prompt["allow_go"]:
            return "the task has no success signal: answer success or failure"
        self._given = answer
        return ""

    def answer(self) -> Answer | None:
        answer, self._given = self._given, None
        if answer is not None:
            self.prompt = None
        return answer

    def cancel(self) -> None:
        """Someone else answered: the prompt is gone."""
        self.prompt, self._given = None, None


class FirstAnswer:
    """Several operators asked at once (a terminal and the console): the first answer counts."""

    def __init__(self, *operators):
        self.operators = operators

    def ask(self, device_id: int, summary: str, *, allow_go: bool = True) -> None:
        for operator in self.operators:
            operator.ask(device_id, summary, allow_go=allow_go)

    def answer(self) -> Answer | None:
        for operator in self.operators:
            answer = operator.answer()
            if answer is not None:
                for other in self.operators:
                    if other is not operator and hasattr(other, "cancel"):
                        other.cancel()
                return answer
        return None
