"""What a replay directory holds, read from its committed indexes without opening it.

Opening a replay (:class:`~embodyrl.replay.PersistentReplay`) is a reopen that
may repair links; deciding how to resume a run needs only the newest commit.
"""

from __future__ import annotations

from pathlib import Path

from .indexfile import read_index
from .layout import INDEX_FILES


def newest_commit(directory: Path) -> dict | None:
    """The newer of the two committed indexes (None when neither holds a commit); ValueError when
    every index there is torn or corrupt."""
    bodies, errors = [], []
    for name in INDEX_FILES:
        try:
            body = read_index(Path(directory) / name)
        except ValueError as err:
            errors.append(str(err))
            continue
        if body is not None:
            bodies.append(body)
    if not bodies and errors:
        raise ValueError(f"{directory}: corrupt index ({'; '.join(errors)})")
    return max(bodies, key=lambda b: b["commit"]) if bodies else None


def rows_added(directory: Path) -> int:
    """How many rows the replay in ``directory`` has committed over its life (0 when there is none,
    or it is unreadable: a resumed run's actors then warm up as a new run's would)."""
    if not Path(directory).is_dir():
        return 0
    try:
        body = newest_commit(directory)
    except ValueError:
        return 0
    return int(body.get("rows_added", 0)) if body else 0
