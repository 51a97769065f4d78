"""Where a learner's metrics records go: ``metrics.jsonl`` and TensorBoard, for every kind of learner
(read back with :mod:`embodyrl.runlog`)."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """One JSON line per record in ``run_dir/metrics.jsonl`` (appended: a resumed run continues
    the file), and the same scalars in ``run_dir/tb`` where tensorboardX is installed."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self._file = self._tb = None  # opened by the first record: a learner built, never run, writes nothing

    def write(self, record: dict, step: int) -> None:
        if self._file is None:
            self._file = (self.run_dir / "metrics.jsonl").open("a")
            self._tb = _tensorboard_writer(self.run_dir / "tb")
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in record.items():  # the scalars; dicts and absent values skipped
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(name, value, global_step=step)
            self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def _tensorboard_writer(directory: Path):
    """A tensorboardX writer for ``directory``, or None where tensorboardX is not installed."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(directory), flush_secs=5)
