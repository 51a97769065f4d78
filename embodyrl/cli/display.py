"""What ``embodyrl train`` shows while it runs, fed by the learner's ``metrics.jsonl``.

The learner already writes one JSON line of metrics every ``log_every_s``;
the display only follows that file, so it costs the learner nothing and
shows exactly what the run records. Three modes:

* ``live``: a rich panel redrawn in place (env steps with a progress bar to
  the budget, episodes, mean return, the share of steps a person took over,
  updates/s, replay size, actors, policy lag, weights version, the learner's
  state, elapsed), drawn on stderr so stdout stays the summary JSON;
* ``plain``: one line every few seconds, for logs and pipes;
* ``quiet``: nothing.

``auto`` picks ``live`` when stdout and stderr are both terminals, else
``plain``: a redirected or CI run gets lines that read well in a log file.

The learner writes a line every second or so; when none has come for
``SILENT_S`` the learner field says so (the actors go on without it).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from ..runlog import is_learner_record

MODES = ("auto", "live", "plain", "quiet")

# label -> how to read it from a metrics record; the order is the panel's
FIELDS = ("env steps", "episodes", "mean return", "interventions", "updates/s", "replay size", "actors",
          "policy lag", "policy age", "weights version", "learner", "elapsed")
SILENT_S = 10.0
"""Seconds without a new metrics line before the learner is shown as silent."""


class MetricsFollower:
    """Reads the lines appended to a ``metrics.jsonl`` since the last call.

    Keeps a half-written last line for the next call, so a line the learner
    is still writing is never parsed in pieces. ``last_return`` is the newest
    non-empty ``episode_return``: most lines carry none (no episode ended in
    that interval) and the display should not blink to "-"; so is
    ``last_intervention_rate``. ``fresh_at``: when the newest line arrived.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self.latest: dict | None = None
        self.last_return: float | None = None
        self.last_intervention_rate: float | None = None
        self.fresh_at: float | None = None

    def poll(self) -> bool:
        """Take in new complete lines; True if any arrived."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return False
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        fresh = False
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line we cannot read is the log's problem, not the display's
            if not is_learner_record(record):
                continue
            self.latest, fresh = record, True
            self.fresh_at = time.monotonic()
            if record.get("episode_return") is not None:
                self.last_return = float(record["episode_return"])
            if record.get("intervention_rate") is not None:
                self.last_intervention_rate = float(record["intervention_rate"])
        return fresh


def _number(value, spec: str = "", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _learner(record: dict | None, silent_s: float | None) -> str:
    if record is None:
        return "starting"
    if silent_s is not None and silent_s >= SILENT_S:
        return f"silent for {silent_s:.0f} s: gone? (actors go on and spool)"
    return "ok"


def view(record: dict | None, last_return: float | None, total_steps: int, elapsed_s: float, *,
         intervention_rate: float | None = None, silent_s: float | None = None) -> dict[str, str]:
    """The displayed fields as text, label -> value (``FIELDS`` order); '-' where unknown yet.
    ``silent_s``: seconds since the learner's last metrics line."""
    r = record or {}
    steps = r.get("env_steps")
    percent = f" ({100.0 * steps / total_steps:.0f}%)" if steps is not None and total_steps > 0 else ""
    minutes, seconds = divmod(int(elapsed_s), 60)
    return {
        "env steps": f"{_number(steps, ',')} / {total_steps:,}{percent}",
        "episodes": _number(r.get("episodes"), ","),
        "mean return": _number(last_return, ".1f"),
        "interventions": "-" if intervention_rate is None else f"{100 * intervention_rate:.0f}% of steps",
        "updates/s": _number(r.get("updates_per_s"), ".0f"),
        "replay size": _number(r.get("replay_size"), ","),
        "actors": _number(r.get("actors")),
        "policy lag": _number(r.get("policy_lag"), ".2f"),
        "policy age": _number(r.get("policy_age"), ".0f") + ("" if r.get("policy_age") is None else " updates"),
        "weights version": _number(r.get("policy_version")),
        "learner": _learner(record, silent_s),
        "elapsed": f"{minutes}:{seconds:02d}",
    }


def plain_line(fields: dict[str, str]) -> str:
    return "  ".join(f"{label} {value}" for label, value in fields.items())


def panel(fields: dict[str, str], steps: int, total_steps: int, title: str):
    """A rich renderable: a progress bar to the step budget over a two-column table."""
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", justify="right")
    table.add_column()
    table.add_row("", ProgressBar(total=max(total_steps, 1), completed=min(steps, total_steps), width=40))
    for label, value in fields.items():
        table.add_row(label, value)
    return Panel(table, title=title, expand=False)


class Display:
    """Follows ``metrics.jsonl`` and shows it in one of the modes; a context manager.

    ``show()`` is cheap to call often: it redraws at most every ``every_s``
    (``show(force=True)`` always does). ``close()`` leaves the last frame on
    screen and gives the terminal back.
    """

    def __init__(self, metrics_path: Path, total_steps: int, mode: str = "auto", *,
                 title: str = "embodyrl train", every_s: float | None = None,
                 stream: TextIO | None = None, console=None):
        if mode not in MODES:
            raise ValueError(f"display mode {mode!r}; known: {', '.join(MODES)}")
        self.mode = resolve_mode(mode) if mode == "auto" else mode
        self.follower = MetricsFollower(metrics_path)
        self.total_steps, self.title = total_steps, title
        self.every_s = every_s if every_s is not None else (0.25 if self.mode == "live" else 5.0)
        self.stream = stream or sys.stderr
        self._console = console
        self._live = None
        self._started = time.monotonic()
        self._last_shown = float("-inf")
        self._silent_since: float | None = None  # the fresh_at whose silence a plain line reported

    def fields(self) -> dict[str, str]:
        f = self.follower
        now = time.monotonic()
        return view(f.latest, f.last_return, self.total_steps, now - self._started,
                    intervention_rate=f.last_intervention_rate,
                    silent_s=None if f.fresh_at is None else now - f.fresh_at)

    def renderable(self):
        steps = (self.follower.latest or {}).get("env_steps") or 0
        return panel(self.fields(), steps, self.total_steps, self.title)

    def start(self) -> Display:
        """Take the terminal for the live panel (other modes need nothing)."""
        if self.mode == "live" and self._live is None:
            from rich.console import Console
            from rich.live import Live

            console = self._console or Console(file=self.stream)
            self._live = Live(self.renderable(), console=console, auto_refresh=False, transient=False)
            self._live.start()
        return self

    def __enter__(self) -> Display:
        return self.start()

    def show(self, force: bool = False) -> None:
        if self.mode == "quiet":
            return
        now = time.monotonic()
        if not force and now - self._last_shown < self.every_s:
            return
        fresh = self.follower.poll()
        if self._live is not None:
            self._live.update(self.renderable(), refresh=True)  # elapsed moves even without new lines
            self._last_shown = now
        elif (fresh or force or self._fell_silent()) and self.follower.latest is not None:
            print(plain_line(self.fields()), file=self.stream, flush=True)
            self._last_shown = now  # until the first line: look again at every call

    def _fell_silent(self) -> bool:
        """True once when the learner has been silent for ``SILENT_S`` (a plain line says so)."""
        at = self.follower.fresh_at
        silent = at is not None and time.monotonic() - at >= SILENT_S
        newly = silent and self._silent_since != at
        if newly:
            self._silent_since = at
        return newly

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self.renderable(), refresh=True)
            self._live.stop()
            self._live = None

    def __exit__(self, *exc) -> None:
        self.close()


def resolve_mode(mode: str, stdout: TextIO | None = None, stderr: TextIO | None = None) -> str:
    """``auto`` -> ``live`` on a terminal (stdout and stderr both), else ``plain``."""
    if mode != "auto":
        return mode
    out, err = stdout or sys.stdout, stderr or sys.stderr
    ttys = all(getattr(s, "isatty", lambda: False)() for s in (out, err))
    return "live" if ttys else "plain"
