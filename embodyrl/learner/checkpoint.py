"""Learner checkpoints with Orbax: the training state pytree plus a JSON record; and the run's
learner incarnations.

The state (parameters, optimiser states, targets, step counters, RNG key) is
saved as it is; typed PRNG keys travel as their raw key data. Saves are
atomic (Orbax writes to a temporary directory and renames it), keep the last
``max_to_keep``, and a resumed learner restores the newest one together with
its JSON record (counters, policy version, replay position, incarnations).

Every learner start draws a new incarnation, and actors go on acting under an
earlier one's weights until the new ones arrive (their spools resend rows
acted before the restart). :func:`record_incarnation` keeps every incarnation
of a run in ``run_dir/incarnations.json``, written before the learner serves
anyone, so that a restart knows them all, even those that crashed before
their first checkpoint; a row naming any other incarnation is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_savable(state):
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, state)


def _from_saved(saved, like):
    return jax.tree.map(lambda s, ref: jax.random.wrap_key_data(s) if _is_key(ref) else s, saved, like)


class Checkpointer:
    def __init__(self, directory: str | Path, max_to_keep: int = 3, own_process: int | None = None):
        """``own_process``: this process's index when several learner hosts each keep their own
        checkpoints of the same state (Orbax then neither waits for nor writes for the others)."""
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._as_numpy = own_process is not None  # Orbax keeps a host's own jax.Arrays for the hosts together
        # One host of several saves synchronously: Orbax's background commit threads, under load, finalised
        # a host's checkpoint while its record was still being written there (FileNotFoundError, then the
        # learner failed at exit). The learner waits for every save anyway, so nothing is lost.
        alone = {} if own_process is None else {"multiprocessing_options": ocp.options.MultiprocessingOptions(
            primary_host=own_process, active_processes={own_process},
            barrier_sync_key_prefix=f"host{own_process}"), "enable_async_checkpointing": False}
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=False, **alone))

    def save(self, step: int, state, record: dict, wait: bool = True) -> None:
        """Save ``state`` and the JSON-able ``record`` as checkpoint ``step``."""
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(self._savable(state)), record=ocp.args.JsonSave(record)))
        if wait:
            self.manager.wait_until_finished()

    def _savable(self, state):
        savable = _to_savable(state)
        return jax.tree.map(np.asarray, savable) if self._as_numpy else savable

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore(self, like, step: int | None = None):
        """(state shaped like ``like``, record) of checkpoint ``step`` (default: the newest)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        savable = self._savable(like)
        abstract = savable if self._as_numpy else jax.tree.map(ocp.utils.to_shape_dtype_struct, savable)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), record=ocp.args.JsonRestore()))
        return _from_saved(restored["state"], like), dict(restored["record"])

    def record(self, step: int | None = None) -> dict:
        """The JSON record of checkpoint ``step`` (default: the newest), without its state."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        restored = self.manager.restore(step, args=ocp.args.Composite(record=ocp.args.JsonRestore()))
        return dict(restored["record"])

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()




INCARNATIONS = "incarnations.json"
"""In the run directory: every learner incarnation of the run, in start order."""


def record_incarnation(run_dir: str | Path, incarnation: int, earlier: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Add ``incarnation`` to ``run_dir``'s :data:`INCARNATIONS` (atomically, synced) and return the
    run's earlier ones, with ``earlier`` (a checkpoint record's, for a run that kept no list yet)."""
    path = Path(run_dir) / INCARNATIONS
    known = list(earlier)
    if path.exists():
        try:
            known += [int(i) for i in json.loads(path.read_text())["incarnations"]]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a list of learner incarnations ({err})") from None
    known = list(dict.fromkeys(i for i in known if i != incarnation))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"incarnations": [*known, incarnation]}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return tuple(known)
