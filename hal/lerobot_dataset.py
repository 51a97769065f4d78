"""LeRobotDataset (v3.0, and v2.1 to read) without LeRobot: pyarrow for Parquet, PyAV for MP4.

A LeRobotDataset directory holds ``meta/info.json`` (features, fps, path
templates), ``meta/tasks.parquet`` (the task strings, pandas-indexed),
``meta/episodes/chunk-*/file-*.parquet`` (one row per episode: its length,
tasks, rows and video segments), ``meta/stats.json``,
``data/chunk-*/file-*.parquet`` (one row per frame: the features plus
``timestamp``, ``frame_index``, ``episode_index``, ``index``,
``task_index``) and ``videos/{camera}/chunk-*/file-*.mp4``. v2.1 kept one
Parquet and one MP4 per episode with JSON-lines metadata.

:class:`LeRobotWriter` appends whole episodes: each episode gets a data file
and, per camera, an MP4 of its own (LeRobot's files roll over by size; one
per episode is a valid roll-over), and the metadata is rewritten after each,
atomically, so a recording killed between episodes leaves a dataset LeRobot
loads. :func:`read_episodes` reads any dataset written so, or by LeRobot.

Frames and steps. A LeRobot frame is (o_t, a_t) with, where recorded,
``next.reward`` r_t and ``next.done``; an embodyrl episode is T steps
(o_t, a_t, r_t, o_{t+1}) and a final row holding o_T. Written out, the T
steps are T frames and o_T is not kept (LeRobot has no place for it); read
in, T frames are T steps whose last one ends the episode, with o_T = o_{T-1}
(as LeRobot's own replay buffer does). ``next.done`` on the last frame is
``terminated`` (``next.truncated``, where present, says truncated instead);
a dataset without it is read as episodes truncated at their end.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DEFAULT_FEATURES = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
                    "task_index": "int64"}
REWARD, DONE, TRUNCATED = "next.reward", "next.done", "next.truncated"
STATE, IMAGES, OBSERVATION, ACTION = "observation.state", "observation.images.", "observation.", "action"
EXTRA = "embodyrl."
"""embodyrl's own columns, which LeRobot has no counterpart for: ``embodyrl.source`` (who acted, as
:class:`~embodyrl.hal.steps.Source`: 0 the policy, 1 a demonstration, 2 a person's takeover),
``embodyrl.proposed_action`` (what the policy proposed where a person took over) and
``embodyrl.policy_version`` (incarnation, count)."""
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
VIDEO_CODEC = "libx264"
VIDEO_OPTIONS = {"g": "2", "crf": "10"}
VIDEO_PIX_FMT = "yuv444p"
"""H.264 in 4:4:4 (any frame size, no chroma halving), a keyframe every 2 frames as LeRobot's own writer
sets, near-lossless: LeRobot's loader decodes it with its pyav backend."""


class DatasetError(ValueError):
    """A dataset that cannot be read or written as asked; the message names the file and the field."""


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ModuleNotFoundError("LeRobot datasets are read and written with pyarrow: pip install "
                                  "'embodyrl[dataset]'", name="pyarrow") from err
    return pa, pq


def _av():
    try:
        import av
    except ImportError as err:
        raise ModuleNotFoundError("LeRobot datasets' videos are read and written with PyAV: pip install "
                                  "'embodyrl[dataset]'", name="av") from err
    return av


def is_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a LeRobotDataset directory (it has ``meta/info.json``)."""
    return (Path(path) / "meta" / "info.json").is_file()


# -- the episodes a dataset holds ------------------------------------------------------------------
@dataclass
class Episode:
    """One episode as frames: ``features`` maps each feature to its (T, ...) array (cameras as
    (T, H, W, 3) uint8), ``task`` its task string."""

    features: dict[str, np.ndarray]
    task: str = ""

    @property
    def length(self) -> int:
        return len(next(iter(self.features.values())))


def read_info(root: str | Path) -> dict:
    path = Path(root) / "meta" / "info.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DatasetError(f"{path}: not readable as JSON ({err})") from None
    version = str(info.get("codebase_version", ""))
    if not version.startswith(("v3.", "v2.1")):
        raise DatasetError(f"{path}: codebase_version {version!r}; this reader knows v3.x and v2.1")
    if not isinstance(info.get("features"), dict) or not isinstance(info.get("fps"), (int, float)):
        raise DatasetError(f"{path}: needs features and fps")
    return info


def dataset_summary(root: str | Path) -> dict:
    """What a dataset's metadata says: its version, episodes, frames, fps, tasks and features."""
    info = read_info(root)
    return {"directory": str(root), "format": "lerobot", "codebase_version": info["codebase_version"],
            "episodes": info.get("total_episodes"), "frames": info.get("total_frames"), "fps": info["fps"],
            "tasks": _tasks(Path(root)) if str(info["codebase_version"]).startswith("v3.") else None,
            "features": {name: {k: v for k, v in feature.items() if k != "info"}
                         for name, feature in info["features"].items() if name not in DEFAULT_FEATURES}}


def read_episodes(root: str | Path, only: set[str] | None = None) -> tuple[dict, list[Episode]]:
    """(info, every episode) of a LeRobotDataset directory, video frames decoded; ``only``: just these
    features (a task that reads one camera of three decodes one)."""
    root = Path(root)
    info = read_info(root)
    wanted = [n for n in info["features"] if n not in DEFAULT_FEATURES and (only is None or n in only)]
    if str(info["codebase_version"]).startswith("v2.1"):
        return info, _read_v21(root, info, wanted)
    pa, pq = _pyarrow()
    data = _concat([pq.read_table(p) for p in sorted(root.glob("data/*/*.parquet"))], root / "data")
    meta = _concat([pq.read_table(p) for p in sorted(root.glob("meta/episodes/*/*.parquet"))], root / "meta/episodes")
    tasks = _tasks(root)
    rows = meta.to_pylist()
    columns = {name: data.column(name) for name in data.column_names}
    index = columns["index"].to_numpy()
    if not np.array_equal(index, np.arange(len(index))):
        raise DatasetError(f"{root}/data: the index column is not 0..{len(index) - 1} in order")
    episodes = []
    for number, row in enumerate(rows):
        if row["episode_index"] != number:
            raise DatasetError(f"{root}/meta/episodes: row {number} holds episode {row['episode_index']}")
        start, stop = int(row["dataset_from_index"]), int(row["dataset_to_index"])
        features = {}
        for name in wanted:
            spec = info["features"][name]
            if spec["dtype"] == "video":
                video = root / info["video_path"].format(
                    video_key=name, chunk_index=row[f"videos/{name}/chunk_index"],
                    file_index=row[f"videos/{name}/file_index"])
                features[name] = _frames(video, float(row[f"videos/{name}/from_timestamp"]), stop - start,
                                         float(info["fps"]))
            elif name in columns:
                features[name] = _column(columns[name], start, stop, spec, name, root)
        task_index = columns["task_index"].to_numpy()[start:stop]
        task = tasks[int(task_index[0])] if len(task_index) and int(task_index[0]) < len(tasks) else ""
        episodes.append(Episode(features, task))
    return info, episodes


def _concat(tables, where: Path):
    pa, _ = _pyarrow()
    if not tables:
        raise DatasetError(f"{where}: no Parquet files")
    try:
        return pa.concat_tables(tables, promote_options="default")
    except pa.ArrowInvalid as err:
        raise DatasetError(f"{where}: its files do not share a schema ({err})") from None


def _tasks(root: Path) -> list[str]:
    _, pq = _pyarrow()
    path = root / "meta" / "tasks.parquet"
    if not path.is_file():
        return []
    table = pq.read_table(path)
    names = table.column_names
    text = next((n for n in ("__index_level_0__", "task") if n in names), None)
    if text is None:
        raise DatasetError(f"{path}: no task strings (an index or a task column)")
    order = table.column("task_index").to_pylist() if "task_index" in names else range(table.num_rows)
    by_index = dict(zip(order, table.column(text).to_pylist(), strict=True))
    return [by_index[i] for i in sorted(by_index)]


def _column(column, start: int, stop: int, spec: dict, name: str, root: Path) -> np.ndarray:
    values = column.slice(start, stop - start)
    if spec["dtype"] == "image":
        return _pngs(values.to_pylist())
    shape = tuple(spec.get("shape") or (1,))
    try:
        array = np.asarray(values.to_pylist(), dtype=np.dtype(spec["dtype"]))
    except (TypeError, ValueError) as err:
        raise DatasetError(f"{root}: feature {name!r}: not {spec['dtype']}{list(shape)} ({err})") from None
    return array.reshape(stop - start, *shape)


def _pngs(values) -> np.ndarray:
    av = _av()
    import io

    frames = []
    for value in values:
        with av.open(io.BytesIO(value["bytes"])) as container:
            frames.append(next(container.decode(video=0)).to_ndarray(format="rgb24"))
    return np.stack(frames)


def _frames(path: Path, start_s: float, count: int, fps: float) -> np.ndarray:
    """The ``count`` frames of one episode from ``start_s`` in ``path``, matched by timestamp."""
    av = _av()
    if not path.is_file():
        raise DatasetError(f"{path}: missing (the episodes metadata names it)")
    frames: list[np.ndarray | None] = [None] * count
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        container.seek(max(0, int(start_s / stream.time_base)) if start_s > 0 else 0, stream=stream, backward=True)
        for frame in container.decode(stream):
            k = round((float(frame.time) - start_s) * fps)
            if k >= count:
                break
            if k >= 0 and abs(float(frame.time) - (start_s + k / fps)) < 0.5 / fps:
                frames[k] = frame.to_ndarray(format="rgb24")
    missing = [k for k, f in enumerate(frames) if f is None]
    if missing:
        raise DatasetError(f"{path}: no frame at {len(missing)} of the episode's {count} timestamps (from "
                           f"{start_s:.3f} s, first missing: frame {missing[0]})")
    return np.stack(frames)  # height x width x 3 whichever layout the feature's shape declares


def _read_v21(root: Path, info: dict, wanted: list[str]) -> list[Episode]:
    _, pq = _pyarrow()
    meta = [json.loads(line) for line in (root / "meta" / "episodes.jsonl").read_text().splitlines() if line.strip()]
    tasks = {}
    tasks_path = root / "meta" / "tasks.jsonl"
    if tasks_path.is_file():
        for line in tasks_path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                tasks[entry["task_index"]] = entry["task"]
    chunks = int(info.get("chunks_size", CHUNKS_SIZE))
    episodes = []
    for row in sorted(meta, key=lambda r: r["episode_index"]):
        number = int(row["episode_index"])
        place = {"episode_chunk": number // chunks, "episode_index": number}
        table = pq.read_table(root / info["data_path"].format(**place))
        columns = {name: table.column(name) for name in table.column_names}
        length = table.num_rows
        features = {}
        for name in wanted:
            spec = info["features"][name]
            if spec["dtype"] == "video":
                video = root / info["video_path"].format(video_key=name, **place)
                features[name] = _frames(video, 0.0, length, float(info["fps"]))
            elif name in columns:
                features[name] = _column(columns[name], 0, length, spec, name, root)
        task_index = int(columns["task_index"].to_numpy()[0]) if "task_index" in columns and length else 0
        episodes.append(Episode(features, tasks.get(task_index, "")))
    return episodes


# -- writing ------------------------------------------------------------------------------------------
class LeRobotWriter:
    """Appends whole episodes to a LeRobotDataset v3.0 directory (created on the first episode, or
    opened where one is: a recording resumed appends after the episodes it holds).

    ``features``: LeRobot's feature dicts (``dtype``, ``shape``, ``names``), cameras with dtype
    ``video`` and shape (H, W, 3); the default features are added here."""

    def __init__(self, root: str | Path, features: Mapping[str, dict], *, fps: float, robot_type: str | None = None):
        self.root = Path(root)
        self.fps = int(fps) if float(fps).is_integer() else float(fps)  # LeRobot's info keeps an int
        self.features = {**{k: dict(v) for k, v in features.items()},
                         **{k: {"dtype": d, "shape": [1], "names": None} for k, d in DEFAULT_FEATURES.items()}}
        self.cameras = [k for k, f in self.features.items() if f["dtype"] == "video"]
        self.robot_type = robot_type
        self.episodes: list[dict] = []
        self.tasks: list[str] = []
        self.stats_parts: dict[str, list[dict]] = {}
        if is_dataset(self.root):
            self._reopen()

    @property
    def frames(self) -> int:
        return sum(e["length"] for e in self.episodes)

    def _reopen(self) -> None:
        info = read_info(self.root)
        mine = {k: {kk: v[kk] for kk in ("dtype", "shape", "names")} for k, v in self.features.items()}
        theirs = {k: {kk: v.get(kk) for kk in ("dtype", "shape", "names")} for k, v in info["features"].items()}
        if mine != theirs or info.get("fps") != self.fps:
            raise DatasetError(f"{self.root}: holds a dataset of other features or fps; write into another directory")
        _, pq = _pyarrow()
        for path in sorted(self.root.glob("meta/episodes/*/*.parquet")):
            self.episodes += [{k: v for k, v in row.items() if not k.startswith("stats/")}
                              for row in pq.read_table(path).to_pylist()]
        self.tasks = _tasks(self.root)
        stats = self.root / "meta" / "episodes_stats.json"  # the per-episode stats the global ones come from
        if stats.is_file():
            self.stats_parts = json.loads(stats.read_text())

    def add(self, episode: Episode) -> None:
        """Write one episode (its data file, its videos), then the metadata."""
        pa, pq = _pyarrow()
        length = episode.length
        if length < 1:
            raise DatasetError("an episode needs at least one frame")
        missing = [k for k in self.features if k not in DEFAULT_FEATURES and k not in episode.features]
        if missing:
            raise DatasetError(f"the episode lacks features {missing}")
        number, start = len(self.episodes), self.frames
        chunk, file = divmod(number, CHUNKS_SIZE)
        if episode.task not in self.tasks:
            self.tasks.append(episode.task)
        task_index = self.tasks.index(episode.task)
        frames = {k: np.asarray(v) for k, v in episode.features.items()}
        frames["timestamp"] = (np.arange(length, dtype=np.float32) / np.float32(self.fps))
        frames["frame_index"] = np.arange(length, dtype=np.int64)
        frames["episode_index"] = np.full(length, number, np.int64)
        frames["index"] = np.arange(start, start + length, dtype=np.int64)
        frames["task_index"] = np.full(length, task_index, np.int64)
        row = {"episode_index": number, "tasks": [episode.task], "length": length, "data/chunk_index": chunk,
               "data/file_index": file, "dataset_from_index": start, "dataset_to_index": start + length}
        for camera in self.cameras:
            path = self.root / VIDEO_PATH.format(video_key=camera, chunk_index=chunk, file_index=file)
            _encode(path, frames[camera], self.fps)
            row |= {f"videos/{camera}/chunk_index": chunk, f"videos/{camera}/file_index": file,
                    f"videos/{camera}/from_timestamp": 0.0, f"videos/{camera}/to_timestamp": length / self.fps}
        columns = {}
        for name, spec in self.features.items():
            if name in self.cameras:
                continue
            values = frames[name]
            shape = tuple(spec["shape"])
            dtype = np.dtype(spec["dtype"])
            if values.shape[1:] not in (shape, ()) and values.reshape(length, -1).shape[1] != math.prod(shape):
                raise DatasetError(f"feature {name!r}: frames shaped {values.shape[1:]}, declared {list(shape)}")
            values = values.reshape(length, *shape).astype(dtype, copy=False)
            arrow = pa.from_numpy_dtype(dtype)
            columns[name] = (pa.array(values[:, 0], arrow) if shape == (1,) else
                             pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), arrow), shape[0]))
        path = self.root / DATA_PATH.format(chunk_index=chunk, file_index=file)
        _atomic(path, lambda p: pq.write_table(pa.table(columns), p, compression="snappy"))
        for name in self.features:
            value = frames[name]
            image = name in self.cameras
            part = _stats(value.reshape(-1, 3) / 255.0 if image else value.reshape(length, -1), image)
            self.stats_parts.setdefault(name, []).append(part)
        self.episodes.append(row | {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        self._write_meta()

    def _write_meta(self) -> None:
        pa, pq = _pyarrow()
        meta = self.root / "meta"
        _atomic(self.root / EPISODES_PATH.format(chunk_index=0, file_index=0),
                lambda p: pq.write_table(pa.Table.from_pylist(self.episodes), p))
        pandas = {"index_columns": ["__index_level_0__"], "column_indexes": [], "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None}]}
        tasks = pa.table({"task_index": pa.array(range(len(self.tasks)), pa.int64()),
                          "__index_level_0__": pa.array(self.tasks, pa.string())})
        _atomic(meta / "tasks.parquet",
                lambda p: pq.write_table(tasks.replace_schema_metadata({"pandas": json.dumps(pandas)}), p))
        _atomic(meta / "episodes_stats.json", lambda p: p.write_text(json.dumps(self.stats_parts)))
        stats = {name: _merged(parts, name in self.cameras) for name, parts in self.stats_parts.items()}
        _atomic(meta / "stats.json", lambda p: p.write_text(json.dumps(stats, indent=2)))
        features = {k: dict(v) for k, v in self.features.items()}
        for camera in self.cameras:
            height, width = features[camera]["shape"][:2]
            features[camera]["info"] = {"video.height": height, "video.width": width, "video.codec": "h264",
                                        "video.pix_fmt": VIDEO_PIX_FMT, "video.is_depth_map": False,
                                        "video.fps": self.fps, "video.channels": 3, "has_audio": False}
        info = {"codebase_version": VERSION, "robot_type": self.robot_type, "total_episodes": len(self.episodes),
                "total_frames": self.frames, "total_tasks": len(self.tasks), "chunks_size": CHUNKS_SIZE,
                "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": self.fps,
                "splits": {"train": f"0:{len(self.episodes)}"}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if self.cameras else None, "features": features}
        _atomic(meta / "info.json", lambda p: p.write_text(json.dumps(info, indent=4)))


def _atomic(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _encode(path: Path, frames: np.ndarray, fps: float) -> None:
    """Frames (T, H, W, 3) uint8 as an MP4, frame k at exactly k / fps."""
    av = _av()
    rate = Fraction(fps).limit_denominator(1000)

    def write(tmp: Path) -> None:
        with av.open(str(tmp), "w", format="mp4") as container:
            stream = container.add_stream(VIDEO_CODEC, rate=rate, options=dict(VIDEO_OPTIONS))
            stream.pix_fmt, stream.height, stream.width = VIDEO_PIX_FMT, frames.shape[1], frames.shape[2]
            stream.time_base = 1 / rate
            for k, image in enumerate(frames):
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image, np.uint8), format="rgb24")
                frame.pts, frame.time_base = k, 1 / rate
                container.mux(stream.encode(frame))
            container.mux(stream.encode())
    _atomic(path, write)


def _stats(values: np.ndarray, image: bool) -> dict:
    """One episode's stats of a feature, as LeRobot keeps them (images per channel, shaped (3, 1, 1))."""
    x = np.asarray(values, np.float64)
    if x.ndim == 1:
        x = x[:, None]
    parts = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0),
             **{f"q{int(q * 100):02d}": np.quantile(x, q, axis=0) for q in QUANTILES}}
    out = {k: (v.reshape(3, 1, 1) if image else v).tolist() for k, v in parts.items()}
    out["count"] = [len(x)]
    return out


def _merged(parts: Sequence[dict], image: bool) -> dict:
    """Global stats from per-episode ones as LeRobot aggregates them: count-weighted mean and variance,
    elementwise extremes, count-weighted quantiles."""
    counts = np.array([p["count"][0] for p in parts], np.float64)
    weights = counts / counts.sum()
    arrays = {k: np.array([p[k] for p in parts], np.float64) for k in parts[0] if k != "count"}
    shape = (-1,) + (1,) * (arrays["mean"].ndim - 1)
    mean = (arrays["mean"] * weights.reshape(shape)).sum(0)
    variance = ((arrays["std"] ** 2 + (arrays["mean"] - mean) ** 2) * weights.reshape(shape)).sum(0)
    out = {"min": arrays["min"].min(0), "max": arrays["max"].max(0), "mean": mean, "std": np.sqrt(variance)}
    for q in QUANTILES:
        key = f"q{int(q * 100):02d}"
        out[key] = (arrays[key] * weights.reshape(shape)).sum(0)
    result = {k: v.tolist() for k, v in out.items()}
    result["count"] = [int(counts.sum())]
    return result
