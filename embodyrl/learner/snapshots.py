"""Policy snapshots along a run (``eval_every``): the learning curve a user can check afterwards.

Every ``eval_every`` environment steps the learner keeps the policy of that moment in
``snapshots/STEPS/`` (the ``policy/`` format, plus ``snapshot.json``: the steps and updates it had).
``embodyrl train`` evaluates each one after the run, as it evaluates the final policy, so the
curve costs the training nothing but a file write and is measured on the same seeded episodes at
every point (:func:`embodyrl.cli.evaluate.evaluate_snapshots`). A resumed run keeps its earlier
snapshots and goes on from the next multiple.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

SNAPSHOTS = "snapshots"
META = "snapshot.json"


class Snapshots:
    """``save(directory, version, weights)`` writes a policy directory; :meth:`observe` calls it as
    each multiple of ``every`` steps is passed, up to the step ``budget``, whose snapshot
    :meth:`finish` takes once the run's last updates are done (the final policy)."""

    def __init__(self, run_dir: Path, every: int, save: Callable, budget: int | None = None):
        self.directory, self.every, self._save, self.budget = Path(run_dir) / SNAPSHOTS, every, save, budget
        kept = [int(p.name) for p in self.directory.glob("*") if p.name.isdigit() and (p / META).exists()]
        self.next = max(kept, default=0) + every

    def observe(self, env_steps: int, updates: int, version, weights: Callable[[], dict]) -> None:
        """The run is at ``env_steps`` and ``updates``: keep the policy if a multiple was passed
        (several passed at once keep one snapshot, at the newest)."""
        if env_steps < self.next or (self.budget is not None and env_steps >= self.budget):
            return
        self._keep(env_steps // self.every * self.every, env_steps, updates, version, weights)

    def finish(self, env_steps: int, updates: int, version, weights: Callable[[], dict]) -> None:
        """The run ended: keep the final policy as the budget's snapshot (where it is a multiple)."""
        if self.budget is None or env_steps < self.budget:
            return self.observe(env_steps, updates, version, weights)
        if self.budget % self.every == 0:
            self._keep(self.budget, env_steps, updates, version, weights)

    def _keep(self, mark: int, env_steps: int, updates: int, version, weights: Callable[[], dict]) -> None:
        directory = self.directory / f"{mark:09d}"
        self._save(directory, version, weights())
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
