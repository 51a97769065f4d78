"""Policy snapshots along a run (``eval_every``): the learning curve a user can check afterwards.

Every ``eval_every`` environment steps the learner keeps the policy of that moment in
``snapshots/STEPS/`` (the ``policy/`` format, plus ``snapshot.json``: the steps and updates it had).
``embodyrl train`` evaluates each one after the run, as it evaluates the final policy, so the
curve costs the training nothing but a file write and is measured on the same seeded episodes at
every point (:func:`embodyrl.cli.evaluate.evaluate_snapshots`). Each point is the policy as
training reached its steps, the run's last one too: the final policy (``policy/``) also has the
updates the learner still owed when the actors stopped. A resumed run keeps its earlier snapshots
and goes on from the next multiple.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

SNAPSHOTS = "snapshots"
META = "snapshot.json"


class Snapshots:
    """``save(version, weights, directory)`` writes a policy directory; :meth:`observe` calls it as
    each multiple of ``every`` steps is passed."""

    def __init__(self, run_dir: Path, every: int, save: Callable):
        self.directory, self.every, self._save = Path(run_dir) / SNAPSHOTS, every, save
        self.next = max((meta["env_steps"] for meta, _ in kept(run_dir)), default=0) + every

    @classmethod
    def of(cls, config, run_dir: Path, save: Callable) -> Snapshots | None:
        """The snapshots ``config.eval_every`` asks for (None: 0, none)."""
        return cls(run_dir, config.eval_every, save) if config.eval_every else None

    def observe(self, env_steps: int, updates: int, version, weights: Callable[[], dict]) -> None:
        """The run is at ``env_steps`` and ``updates``: keep the policy if a multiple was passed
        (several passed at once keep one snapshot, at the newest)."""
        if env_steps < self.next:
            return
        mark = env_steps // self.every * self.every
        directory = self.directory / f"{mark:09d}"
        self._save(version, weights(), directory)
        (directory / META).write_text(json.dumps({"env_steps": mark, "env_steps_taken": env_steps,
                                                  "updates": updates, "version": list(version)}) + "\n")
        self.next = mark + self.every


def kept(run_dir: Path) -> list[tuple[dict, Path]]:
    """(meta, directory) of each snapshot of ``run_dir``, oldest first."""
    out = []
    for path in sorted((Path(run_dir) / SNAPSHOTS).glob("*")):
        if path.name.isdigit() and (path / META).exists():
            out.append((json.loads((path / META).read_text()), path))
    return out
