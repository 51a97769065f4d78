"""Demonstrations as LeRobotDataset: embodyrl's steps to LeRobot's frames and back.

Features and fields, by name (a robot file's ``dataset_features``, ``learner.demos_features``, may map them
otherwise; :func:`feature_of`):

=========================  =========================================
embodyrl                   LeRobot
=========================  =========================================
observation ``state``      ``observation.state`` (element names kept)
a camera field ``front``   ``observation.images.front`` (an MP4)
any other field ``x``      ``observation.x``
the applied action         ``action`` (element names kept)
reward r_t                 ``next.reward``
terminated, truncated      ``next.done``, ``next.truncated``
source, proposed action,   ``embodyrl.source``, ``embodyrl.proposed_action``,
policy version             ``embodyrl.policy_version``
the final observation o_T  not kept (LeRobot has no place for it)
=========================  =========================================

Read in, a dataset's episodes become demonstration steps of a task's device
kind: each field from its feature (reordered by element names where both
carry them; refused naming the field where a feature is missing, or its
shape, names or dtype do not fit), ``next.reward`` as the reward (0 where
the dataset has none), the last frame ending the episode (terminated on
``next.done``, truncated on ``next.truncated`` or where the dataset says
neither), and o_T = o_{T-1}. Actions outside the action's bounds are clipped
into them and counted (a leader arm moved past the follower's declared
limits).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .lerobot_dataset import (
    ACTION,
    DONE,
    EXTRA,
    IMAGES,
    OBSERVATION,
    REWARD,
    STATE,
    TRUNCATED,
    DatasetError,
    Episode,
    read_episodes,
    read_info,
)
from .specs import ArraySpec, DictSpec, SpecError
from .steps import NO_POLICY, SCALAR_COLUMNS, Source, Steps, new_episode_id

log = logging.getLogger(__name__)

SOURCE, PROPOSED, VERSION = EXTRA + "source", EXTRA + "proposed_action", EXTRA + "policy_version"


def is_camera(spec: ArraySpec) -> bool:
    return len(spec.shape) == 3 and spec.shape[-1] == 3 and spec.dtype == np.uint8


def feature_of(field: str, spec: ArraySpec) -> str:
    """The LeRobot feature an observation field is written as (and first looked for as)."""
    if is_camera(spec):
        return IMAGES + field
    return STATE if field == "state" else OBSERVATION + field


def features(observation_spec: DictSpec, action_spec: ArraySpec) -> dict[str, dict]:
    """LeRobot's features for demonstrations of these specs, embodyrl's extra columns included."""
    out = {}
    for name, spec in observation_spec.items():
        if is_camera(spec):
            out[feature_of(name, spec)] = {"dtype": "video", "shape": list(spec.shape),
                                           "names": ["height", "width", "channels"]}
        else:
            out[feature_of(name, spec)] = {"dtype": spec.dtype.name, "shape": list(spec.shape) or [1],
                                           "names": list(spec.names) if spec.names else None}
    vector = {"shape": list(action_spec.shape), "names": list(action_spec.names) if action_spec.names else None}
    out[ACTION] = {"dtype": action_spec.dtype.name, **vector}
    out[REWARD] = {"dtype": "float32", "shape": [1], "names": None}
    out[DONE] = {"dtype": "bool", "shape": [1], "names": None}
    out[TRUNCATED] = {"dtype": "bool", "shape": [1], "names": None}
    out[SOURCE] = {"dtype": "int64", "shape": [1], "names": None}
    out[PROPOSED] = {"dtype": action_spec.dtype.name, **vector}
    out[VERSION] = {"dtype": "int64", "shape": [2], "names": ["incarnation", "count"]}
    return out


def episodes_of(steps: Steps, task: str) -> list[Episode]:
    """The complete episodes of a batch of steps as LeRobot frames (o_T dropped)."""
    columns = steps.arrays()
    finals = np.flatnonzero(columns["final"])
    episodes, start = [], 0
    for end in finals:
        acted = slice(start, end)
        frames = {feature_of(name, spec_of(columns, name)): columns[f"observation/{name}"][acted]
                  for name in steps.observation}
        frames[ACTION] = columns["action"][acted]
        frames[REWARD] = columns["reward"][acted].astype(np.float32)
        frames[DONE] = columns["terminated"][acted] | columns["truncated"][acted]
        frames[TRUNCATED] = columns["truncated"][acted]
        frames[SOURCE] = columns["source"][acted].astype(np.int64)
        frames[PROPOSED] = columns["proposed_action"][acted]
        frames[VERSION] = np.stack([columns["policy_incarnation"][acted], columns["policy_count"][acted]], axis=1)
        if end > start:
            episodes.append(Episode(frames, task))
        start = end + 1
    return episodes


def spec_of(columns: Mapping[str, np.ndarray], name: str) -> ArraySpec:
    column = columns[f"observation/{name}"]
    return ArraySpec(name, column.shape[1:], column.dtype)


def content_hash(root: str | Path) -> str:
    """SHA-256 over a dataset directory's files (relative names and bytes, in sorted order)."""
    root = Path(root)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".tmp")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _lookup(info: dict, field: str, spec: ArraySpec, mapping: Mapping[str, str]) -> str:
    names = info["features"]
    if field in mapping:
        if mapping[field] not in names:
            raise SpecError(f"observation {field!r}: the mapping names feature {mapping[field]!r}, which the "
                            f"dataset lacks; it has {', '.join(names)}")
        return mapping[field]
    for candidate in (feature_of(field, spec), OBSERVATION + field, IMAGES + field, field):
        if candidate in names:
            return candidate
    raise SpecError(f"observation {field!r}: the dataset has no feature {feature_of(field, spec)!r} (nor "
                    f"{OBSERVATION + field!r}); it has {', '.join(names)} (map it with a"
                    " robot file's dataset_features)")


def _order(spec: ArraySpec, feature: dict, what: str) -> np.ndarray | None:
    """Indices that reorder the feature's elements into the spec's (None: as they are)."""
    names = feature.get("names")
    if isinstance(names, dict):  # v2.0 ports: {"motors": [...]}
        names = next(iter(names.values()), None)
    if spec.names is None or not isinstance(names, list) or len(names) != len(spec.names):
        return None
    if list(names) == list(spec.names):
        return None
    missing = [n for n in spec.names if n not in names]
    if missing:
        raise SpecError(f"{what}: the dataset's elements are {names}; the task's {', '.join(missing)} are not among them")
    return np.array([names.index(n) for n in spec.names])


def _fitted(values: np.ndarray, spec: ArraySpec, feature: dict, what: str) -> np.ndarray:
    order = _order(spec, feature, what)
    if order is not None:
        values = values[..., order]
    length = len(values)
    if is_camera(spec):
        if values.shape[1:] != spec.shape:
            raise SpecError(f"{what}: frames of {list(values.shape[1:])}; the task's are {list(spec.shape)}")
        return values.astype(np.uint8, copy=False)
    if values.reshape(length, -1).shape[1] != max(1, spec.size):
        raise SpecError(f"{what}: {list(values.shape[1:])} per frame; the task's is {list(spec.shape)}")
    if values.dtype.kind not in "biuf":
        raise SpecError(f"{what}: dtype {values.dtype}, not a number")
    return values.reshape(length, *spec.shape).astype(spec.dtype)


def check(root: str | Path, observation_spec: DictSpec, action_spec: ArraySpec,
          mapping: Mapping[str, str] | None = None) -> str | None:
    """Why the dataset does not fit these specs, in words (None: it fits), from its metadata alone."""
    return _misfit(read_info(root), observation_spec, action_spec, mapping or {})


def _misfit(info: dict, observation_spec: DictSpec, action_spec: ArraySpec,
            mapping: Mapping[str, str]) -> str | None:
    try:
        for field, spec in observation_spec.items():
            feature = info["features"][_lookup(info, field, spec, mapping)]
            _check_shape(spec, feature, f"observation {field!r}")
        if ACTION not in info["features"]:
            raise SpecError(f"action: the dataset has no {ACTION!r} feature")
        _check_shape(action_spec, info["features"][ACTION], "action")
    except SpecError as err:
        return str(err)
    return None


def _check_shape(spec: ArraySpec, feature: dict, what: str) -> None:
    shape = tuple(feature.get("shape") or (1,))
    if feature.get("dtype") in ("video", "image"):
        names = feature.get("names") or []
        hwc = tuple(shape[1:]) + shape[:1] if len(names) == 3 and names[0] in ("channels", "channel") else shape
        if hwc != spec.shape:
            raise SpecError(f"{what}: the dataset's frames are {list(hwc)}; the task's are {list(spec.shape)}")
        return
    if int(np.prod(shape)) != max(1, spec.size):
        raise SpecError(f"{what}: the dataset's is {list(shape)}; the task's is {list(spec.shape)}")
    _order(spec, feature, what)


def load(root: str | Path, observation_spec: DictSpec, action_spec: ArraySpec, *,
         mapping: Mapping[str, str] | None = None, batch_rows: int = 256, actor_id: int = 0,
         device_id: int = 0) -> list[Steps]:
    """A dataset's episodes as validated demonstration :class:`Steps` of these specs."""
    mapping = mapping or {}
    info = read_info(root)
    reason = _misfit(info, observation_spec, action_spec, mapping)
    if reason is not None:
        raise SpecError(f"{root}: {reason}")
    needed = {_lookup(info, field, spec, mapping) for field, spec in observation_spec.items()}
    try:
        info, episodes = read_episodes(root, only=needed | {ACTION, REWARD, DONE, TRUNCATED})
    except DatasetError as err:
        raise SpecError(str(err)) from None
    batches, clipped = [], 0
    for number, episode in enumerate(episodes):
        where = f"{root}: episode {number}"
        columns, clip = _columns(info, episode, observation_spec, action_spec, mapping, where)
        clipped += clip
        columns["actor_id"] = np.full(len(columns["reward"]), actor_id, SCALAR_COLUMNS["actor_id"])
        columns["device_id"] = np.full(len(columns["reward"]), device_id, SCALAR_COLUMNS["device_id"])
        try:
            steps = Steps.from_arrays(columns, observation_spec, action_spec)
        except SpecError as err:
            raise SpecError(f"{where}: {err}") from None
        arrays = steps.arrays()
        n = len(steps)
        batches += [Steps.from_arrays({k: v[i:i + batch_rows] for k, v in arrays.items()}, observation_spec,
                                      action_spec) for i in range(0, n, batch_rows)]
    if clipped:
        log.warning("%s: %d actions outside the task's action bounds were clipped into them", root, clipped)
    return batches


def _columns(info: dict, episode: Episode, observation_spec: DictSpec, action_spec: ArraySpec,
             mapping: Mapping[str, str], where: str) -> tuple[dict[str, np.ndarray], int]:
    frames = episode.features
    length = episode.length
    rows = length + 1
    columns: dict[str, np.ndarray] = {}
    for field, spec in observation_spec.items():
        name = _lookup(info, field, spec, mapping)
        values = _fitted(np.asarray(frames[name]), spec, info["features"][name], f"{where}: observation {field!r}")
        columns[f"observation/{field}"] = np.concatenate([values, values[-1:]])
    action = _fitted(np.asarray(frames[ACTION]), action_spec, info["features"][ACTION], f"{where}: action")
    low, high = action_spec.limits
    clipped_rows = int(np.any((action < low) | (action > high), axis=tuple(range(1, action.ndim))).sum())
    action = np.clip(action, low, high).astype(action_spec.dtype)
    columns["action"] = np.concatenate([action, np.zeros((1, *action_spec.shape), action_spec.dtype)])
    columns["proposed_action"] = columns["action"]
    reward = np.asarray(frames[REWARD], np.float32).reshape(length) if REWARD in frames else np.zeros(length, np.float32)
    columns["reward"] = np.concatenate([reward, [0.0]]).astype(SCALAR_COLUMNS["reward"])
    done = bool(np.asarray(frames[DONE]).reshape(length)[-1]) if DONE in frames else None
    truncated = bool(np.asarray(frames[TRUNCATED]).reshape(length)[-1]) if TRUNCATED in frames else None
    end_truncated = truncated if truncated is not None else not done
    flags = np.zeros(rows, bool)
    columns["terminated"], columns["truncated"] = flags.copy(), flags.copy()
    columns["terminated" if not end_truncated else "truncated"][length - 1] = True
    columns["final"] = np.zeros(rows, bool)
    columns["final"][-1] = True
    columns["log_prob"] = np.zeros(rows, SCALAR_COLUMNS["log_prob"])
    columns["episode_id"] = np.full(rows, new_episode_id(), SCALAR_COLUMNS["episode_id"])
    columns["step_index"] = np.arange(rows, dtype=SCALAR_COLUMNS["step_index"])
    columns["policy_incarnation"] = np.full(rows, NO_POLICY.incarnation, SCALAR_COLUMNS["policy_incarnation"])
    columns["policy_count"] = np.full(rows, NO_POLICY.count, SCALAR_COLUMNS["policy_count"])
    columns["source"] = np.full(rows, Source.DEMONSTRATION, SCALAR_COLUMNS["source"])
    return {k: v.astype(SCALAR_COLUMNS[k], copy=False) if k in SCALAR_COLUMNS else v
            for k, v in columns.items()}, clipped_rows


def writer(out: str | Path, observation_spec: DictSpec, action_spec: ArraySpec, *, fps: float,
           robot_type: str | None = None):
    """A :class:`~.lerobot_dataset.LeRobotWriter` for demonstrations of these specs (reopened where
    ``out`` holds one already: its features and fps must agree)."""
    from .lerobot_dataset import LeRobotWriter

    return LeRobotWriter(out, features(observation_spec, action_spec), fps=fps, robot_type=robot_type)


def export(directory: str | Path, out: str | Path, *, fps: float | None = None, task: str | None = None) -> dict:
    """Write embodyrl's demonstration files of ``directory`` as a LeRobotDataset v3.0 at ``out``.

    ``fps`` defaults to the rate the files were recorded at (``control_period_s`` in their meta);
    ``task`` to the robot they name. Returns counts (episodes, frames)."""
    from .demos import demo_files, load_demonstrations, read_meta, read_specs

    files = demo_files([directory])
    observation_spec, action_spec = read_specs(files[0])
    metas = [read_meta(path) for path in files]
    for path in files[1:]:
        if read_specs(path) != (observation_spec, action_spec):
            raise SpecError(f"{path}: recorded with other specs than {files[0].name}; export them separately")
    if fps is None:
        periods = {m.get("control_period_s") for m in metas}
        if None in periods or len(periods) != 1:
            raise SpecError(f"{directory}: the files do not all say the rate they were recorded at; give --fps")
        fps = 1.0 / periods.pop()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise SpecError(f"{out}: not empty; export into a new directory")
    dataset = writer(out, observation_spec, action_spec, fps=fps, robot_type=metas[0].get("robot"))
    for path, meta in zip(files, metas, strict=True):
        steps = load_demonstrations(path, batch_rows=1 << 62)[0]
        label = task if task is not None else str(meta.get("task") or meta.get("robot") or "")
        for episode in episodes_of(steps, label):
            dataset.add(episode)
    return {"episodes": len(dataset.episodes), "frames": dataset.frames, "fps": fps, "out": str(out)}
