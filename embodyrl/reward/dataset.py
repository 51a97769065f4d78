"""Demonstration directories to labelled camera frames, split by episode.

The labelling rule (HIL-SERL's): an episode of length L holds the
observations o_0 ... o_L (its final row holds o_L). In a successful episode
the last ``last_k`` of them, o_{L-k+1} ... o_L, are positive (the task is
done or about to be) and the others negative; every frame of a failed
episode is negative. A file's ``success`` label (its meta, written by
``embodyrl record``) is that of its one episode. Nothing here imports JAX.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..hal.demos import demo_files as listed_demo_files
from ..hal.demos import read_meta
from ..hal.specs import DictSpec, SpecError


class DatasetError(ValueError):
    """Demonstrations that cannot be turned into labelled frames; the message names the file or field."""


@dataclass(frozen=True)
class Frames:
    """Labelled camera frames, one row per observation, with the episode each came from."""

    images: np.ndarray
    """uint8 [N, H, W, C]."""
    labels: np.ndarray
    """bool [N]: True where the frame shows success."""
    episodes: np.ndarray
    """int [N]: the episode's index in :attr:`files`."""
    files: tuple[str, ...]
    """The demonstration file of each episode."""
    successes: np.ndarray
    """bool [episodes]: each episode's label."""
    camera_field: str
    observation_spec: DictSpec
    """The camera field's spec alone."""

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, episodes: np.ndarray) -> Frames:
        """The frames of the given episodes (indices into :attr:`files`)."""
        rows = np.isin(self.episodes, episodes)
        return Frames(self.images[rows], self.labels[rows], self.episodes[rows], self.files, self.successes,
                      self.camera_field, self.observation_spec)

    def counts(self) -> dict[str, int]:
        """Episodes, positive and negative frames."""
        return {"episodes": int(np.unique(self.episodes).size), "positives": int(self.labels.sum()),
                "negatives": int((~self.labels).sum())}


def last_k_labels(length: int, success: bool, last_k: int) -> np.ndarray:
    """The labels of an episode's ``length + 1`` observations: the last ``last_k`` True if it succeeded."""
    if last_k < 1:
        raise ValueError(f"last_k: must be at least 1, got {last_k}")
    labels = np.zeros(length + 1, bool)
    if success:
        labels[max(0, length + 1 - last_k):] = True
    return labels


def camera_fields(spec: DictSpec) -> list[str]:
    """The fields of ``spec`` that are camera images (HxWxC uint8)."""
    return [s.name for s in spec.specs if len(s.shape) == 3 and np.dtype(s.dtype) == np.uint8]


def pick_camera(spec: DictSpec, camera: str | None, where: str) -> str:
    """``camera`` checked against ``spec``, or the only camera field when None."""
    cameras = camera_fields(spec)
    if camera is not None:
        if camera not in cameras:
            raise DatasetError(f"{where}: --camera {camera!r} is not a camera field (HxWxC uint8) of the "
                               f"demonstrations; they have {', '.join(cameras) or 'none'}")
        return camera
    if not cameras:
        raise DatasetError(f"{where}: the demonstrations have no camera field (HxWxC uint8); their fields: "
                           f"{', '.join(spec)}")
    if len(cameras) > 1:
        raise DatasetError(f"{where}: several camera fields ({', '.join(cameras)}); choose one with --camera")
    return cameras[0]


def demo_files(directories: list[str | Path]) -> list[Path]:
    """The demonstration files (``*.npz``) of each directory, in order; refuses a missing or empty one."""
    if not directories:
        raise DatasetError("no demonstration directories given")
    try:
        return listed_demo_files(directories)
    except ValueError as err:
        raise DatasetError(str(err)) from None


def load_frames(directories: list[str | Path], *, camera: str | None = None, last_k: int = 5) -> Frames:
    """Every observation of every episode in ``directories`` as a labelled frame (the rule above)."""
    files = demo_files(directories)
    images, labels, episodes, successes = [], [], [], []
    camera_spec = None
    for index, path in enumerate(files):
        try:
            meta = read_meta(path)
        except SpecError as err:
            raise DatasetError(str(err)) from None
        spec = DictSpec.from_msg(meta["observation_spec"])
        if camera_spec is None:
            camera = pick_camera(spec, camera, str(path))
            camera_spec = spec[camera]
        elif camera not in spec or spec[camera] != camera_spec:
            found = f"{spec[camera].dtype}{list(spec[camera].shape)}" if camera in spec else "no such field"
            raise DatasetError(f"{path}: {camera!r} is {found}; the first file's is "
                               f"{camera_spec.dtype}{list(camera_spec.shape)}")
        success = meta.get("success")
        if not isinstance(success, bool):
            raise DatasetError(f"{path}: no success label in its meta (record it with embodyrl record)")
        try:
            with np.load(path, allow_pickle=False) as data:
                frames, final = data[f"observation/{camera}"], data["final"].astype(bool)
        except KeyError as err:
            raise DatasetError(f"{path}: missing column {err}") from None
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            raise DatasetError(f"{path}: not a readable demonstration file ({err})") from None
        ends = np.flatnonzero(final)
        if ends.size != 1 or ends[0] != len(final) - 1 or frames.shape != (len(final), *camera_spec.shape):
            raise DatasetError(f"{path}: expected one whole episode ({ends.size} final rows in {len(final)}, "
                               f"frames {frames.shape})")
        images.append(frames)
        labels.append(last_k_labels(len(final) - 1, success, last_k))
        episodes.append(np.full(len(final), index))
        successes.append(success)
    return Frames(np.concatenate(images), np.concatenate(labels), np.concatenate(episodes),
                  tuple(map(str, files)), np.array(successes, bool), camera, DictSpec((camera_spec,)))


def split_episodes(successes: np.ndarray, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) episode indices: a seeded shuffle of the successful and of the failed
    episodes apart, ``held_out`` of each (rounded, at least one where there are two or more) held out,
    so both sides see both outcomes. No episode is on both sides."""
    if not 0 <= held_out < 1:
        raise ValueError(f"held_out: must be in [0, 1), got {held_out}")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for outcome in (True, False):
        members = rng.permutation(np.flatnonzero(successes == outcome))
        count = 0 if held_out == 0 else min(len(members) - 1, max(1, round(held_out * len(members))))
        count = max(count, 0)
        test += members[:count].tolist()
        train += members[count:].tolist()
    return np.array(sorted(train), int), np.array(sorted(test), int)
