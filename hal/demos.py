"""Recorded demonstrations: an on-disk format, a writer and a loader.

Format (version 1): one ``.npz`` file (numpy's zip of ``.npy`` arrays, no
pickle) per recording, holding the step-record columns exactly as
:meth:`Steps.arrays` names them (``observation/<field>``, ``action``,
``proposed_action``, ``reward``, ``terminated``, ``truncated``, ``final``,
``episode_id``, ...), each with one row per step, plus ``meta``: a unicode
string array holding JSON ``{"format": "embodyrl.demos", "version": 1,
"observation_spec": [...], "action_spec": {...}}`` (specs as on the wire).
Episodes are complete: each ends with its ``final`` row. Files are read
with ``np.load(allow_pickle=False)``; an object array is refused.

Loaded demonstrations are :class:`Steps` batches with
``source=Source.DEMONSTRATION``, re-tagged with the sender's actor and
device ids, which an actor sends to the learner like online steps
(:func:`send_demonstrations`); give them a device id of their own in the
HELLO so their rows never interleave with an online stream.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path

import numpy as np

from .specs import ArraySpec, DictSpec, SpecError
from .steps import SCALAR_COLUMNS, Source, Steps

FORMAT = "embodyrl.demos"
VERSION = 1


class DemoWriter:
    """Collects :class:`Steps` batches of one device and writes them as one file.

    Use it as the actor loop's ``tap`` (it is called with every batch the
    loop sends) while a person teleoperates, or feed it batches yourself.
    ``close()`` writes atomically (temporary file, then rename).
    """

    def __init__(self, path: str | Path, observation_spec: DictSpec, action_spec: ArraySpec):
        self.path = Path(path)
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self._batches: list[Steps] = []

    def __call__(self, device_id: int, steps: Steps) -> None:
        self.add(steps)

    def add(self, steps: Steps) -> None:
        self._batches.append(steps)

    @property
    def rows(self) -> int:
        return sum(len(b) for b in self._batches)

    def close(self, **meta) -> Path:
        """Write every complete episode gathered; rows of an unfinished one are dropped. ``meta``
        goes into the file's meta beside the format's own keys (``embodyrl record`` writes
        ``success``, the episode's label, and ``labelled_by``, ``task`` or ``operator``)."""
        if not self._batches:
            raise ValueError(f"{self.path}: no steps to write")
        columns = {k: np.concatenate([b.arrays()[k] for b in self._batches])
                   for k in self._batches[0].arrays()}
        finals = np.flatnonzero(columns["final"])
        if finals.size == 0:
            raise ValueError(f"{self.path}: no complete episode (no final row) to write")
        end = int(finals[-1]) + 1
        columns = {k: v[:end] for k, v in columns.items()}
        meta = {**meta, "format": FORMAT, "version": VERSION,
                "observation_spec": self.observation_spec.to_msg(),
                "action_spec": self.action_spec.to_msg(), "written": time.time()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta)), **columns)
        os.replace(tmp, self.path)
        self._batches.clear()
        return self.path


def demo_files(directories, *, datasets: bool = False) -> list[Path]:
    """The demonstration files (``*.npz``) of each directory, in order; with ``datasets``, a directory
    that is a LeRobotDataset stands for itself (:mod:`.lerobot_demos`). A missing or empty directory
    raises ``ValueError`` naming it (the learner's ``--demos`` and the classifier's trainer read these)."""
    from .lerobot_dataset import is_dataset

    files = []
    for directory in map(Path, directories):
        if not directory.is_dir():
            raise ValueError(f"{directory}: no such directory")
        if datasets and is_dataset(directory):
            files.append(directory)
            continue
        found = sorted(directory.glob("*.npz"))
        if not found:
            raise ValueError(f"{directory}: holds no demonstration files (*.npz; embodyrl record writes them)"
                             + (" and is not a LeRobotDataset (no meta/info.json)" if datasets else ""))
        files += found
    return files


def read_meta(path: str | Path) -> dict:
    """A demonstration file's meta: the format's keys and what its writer added (e.g. ``success``)."""
    with _open(path) as data:
        _specs(path, data)
        return json.loads(str(data["meta"]))


def read_specs(path: str | Path) -> tuple[DictSpec, ArraySpec]:
    """The observation and action specs a demonstration file was recorded with."""
    with _open(path) as data:
        return _specs(path, data)


def load_demonstrations(path: str | Path, *, batch_rows: int = 256, actor_id: int = 0,
                        device_id: int = 0, observation_spec: DictSpec | None = None,
                        action_spec: ArraySpec | None = None) -> list[Steps]:
    """Load a demonstration file as validated :class:`Steps` batches.

    Rows are re-tagged with ``actor_id`` and ``device_id`` (the stream they
    will be sent on) and ``source=DEMONSTRATION``. Given specs must equal
    the file's; a mismatch (:func:`spec_mismatch`), a missing column or a
    malformed value raises :class:`SpecError` naming it.
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows: must be >= 1, got {batch_rows}")
    with _open(path) as data:
        obs_spec, act_spec = _specs(path, data)
        for given, stored, what in ((observation_spec, obs_spec, "observation"),
                                    (action_spec, act_spec, "action")):
            if given is not None and given != stored:
                expected = (given, action_spec) if what == "observation" else (obs_spec, given)
                raise SpecError(f"{path}: {spec_mismatch(obs_spec, act_spec, *expected)}")
        columns = {}
        for k in data.files:
            if k != "meta":
                try:
                    columns[k] = data[k]
                except ValueError as err:  # e.g. an object array: never unpickled
                    raise SpecError(f"{path}: column {k}: {err}") from None
    try:
        steps = Steps.from_arrays(columns, obs_spec, act_spec)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None
    n = len(steps)
    columns = steps.arrays()
    columns["source"] = np.full(n, Source.DEMONSTRATION, SCALAR_COLUMNS["source"])
    columns["actor_id"] = np.full(n, actor_id, SCALAR_COLUMNS["actor_id"])
    columns["device_id"] = np.full(n, device_id, SCALAR_COLUMNS["device_id"])
    return [Steps.from_arrays({k: v[i:i + batch_rows] for k, v in columns.items()}, obs_spec, act_spec)
            for i in range(0, n, batch_rows)]


def spec_mismatch(observation_spec: DictSpec, action_spec: ArraySpec, task_observation: DictSpec,
                  task_action: ArraySpec | None) -> str | None:
    """The first field in which recorded specs differ from a task's, in words (None: they agree),
    e.g. ``observation 'joint_pos': shape (7,) but the task's is (6,)``."""
    for name in sorted(set(observation_spec) | set(task_observation)):
        if name not in task_observation:
            return f"observation {name!r}: recorded, but the task has no such field"
        if name not in observation_spec:
            return f"observation {name!r}: the task has it, the recording does not"
        differs = _field_mismatch(observation_spec[name], task_observation[name])
        if differs is not None:
            return f"observation {name!r}: {differs}"
    if task_action is not None:
        differs = _field_mismatch(action_spec, task_action, name=True)
        if differs is not None:
            return f"action {action_spec.name!r}: {differs}"
    return None


def _field_mismatch(recorded: ArraySpec, task: ArraySpec, name: bool = False) -> str | None:
    if name and recorded.name != task.name:
        return f"named {recorded.name!r} but the task's is {task.name!r}"
    if recorded.shape != task.shape:
        return f"shape {recorded.shape} but the task's is {task.shape}"
    if recorded.dtype != task.dtype:
        return f"dtype {recorded.dtype} but the task's is {task.dtype}"
    for bound in ("minimum", "maximum"):
        mine, theirs = recorded.to_msg().get(bound), task.to_msg().get(bound)
        if mine != theirs:
            return f"{bound} {mine} but the task's is {theirs}"
    return None


def send_demonstrations(link, device_id: int, batches: list[Steps], *, timeout_s: float = 60.0) -> int:
    """Send batches over a connected ``LearnerLink`` as credits allow; return rows sent."""
    sent = 0
    deadline = time.monotonic() + timeout_s
    for steps in batches:
        while link.credits < len(steps):
            if link.bye_reason is not None:
                return sent
            if time.monotonic() > deadline:
                raise TimeoutError(f"no credit for demonstrations within {timeout_s} s ({sent} rows sent)")
            link.poll(50)
        link.send_steps(device_id, steps)
        sent += len(steps)
    return sent


def _open(path):
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise SpecError(f"{path}: not a readable demonstration file ({err})") from None


def _specs(path, data) -> tuple[DictSpec, ArraySpec]:
    if "meta" not in data.files:
        raise SpecError(f"{path}: missing 'meta' (not an {FORMAT} file)")
    try:
        meta = json.loads(str(data["meta"]))
    except (ValueError, TypeError) as err:
        raise SpecError(f"{path}: meta is not a JSON string ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise SpecError(f"{path}: meta.format is not {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise SpecError(f"{path}: meta.version {meta.get('version')!r}; this reader knows {VERSION}")
    return DictSpec.from_msg(meta.get("observation_spec")), ArraySpec.from_msg(meta.get("action_spec"))
