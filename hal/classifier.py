"""A learnt success classifier as a numpy-only forward pass: the reward of a task judged by a camera.

``embodyrl reward train`` fits a small CNN to labelled camera frames (HIL-SERL's
reward classifier) and writes it as two files in one directory, read here
without JAX, on the robot PC:

``classifier.json``::

    {"format": "embodyrl.classifier", "format_version": 1,
     "camera_field": "camera/front",
     "observation_spec": [{"name": "camera/front", "shape": [84, 84, 3], "dtype": "uint8", ...}],
     "graph": [{"op": "image", "fields": ["camera/front"]},
               {"op": "conv2d", "kernel": "convs/0/kernel", "bias": "convs/0/bias", "stride": 2},
               {"op": "relu"}, ..., {"op": "flatten"}, {"op": "dense", ...}, {"op": "relu"},
               {"op": "dense", "kernel": "out/kernel", "bias": "out/bias"}],   # one logit
     "threshold": 0.5, "threshold_from": "given",
     "metrics": {...}}                                     # what training measured

``classifier.npz``: the arrays the graph names (float32, loaded with
``allow_pickle=False``). The ops are the policy runtime's
(:class:`embodyrl.hal.runtime.Graph`, one evaluator for both); the graph
reads only the camera field and ends in one logit. The probability of
success is its sigmoid, and the verdict is ``probability >= threshold``::

    classifier = load_classifier("classifier")
    p = classifier(observation)            # float in [0, 1]; fields may carry batch axes
    success = p >= classifier.threshold
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .runtime import ExportError, Graph
from .specs import DictSpec, SpecError

FORMAT = "embodyrl.classifier"
FORMAT_VERSION = 1
JSON_FILE = "classifier.json"
NPZ_FILE = "classifier.npz"
FILES = (JSON_FILE, NPZ_FILE)
"""The files of an export, in the order their hashes are recorded."""


class ClassifierError(ExportError):
    """A classifier export that cannot be used; the message names the file and what is wrong."""


def sigmoid(logit: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow for large negative x."""
    x = np.asarray(logit, np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


class SuccessClassifier:
    """P(success | camera frame) from an export; ``threshold`` turns it into a verdict."""

    def __init__(self, meta: Mapping, arrays: Mapping[str, np.ndarray], label: str = "classifier"):
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise ClassifierError(f"{label}: not an {FORMAT} v{FORMAT_VERSION} export: format "
                                  f"{meta.get('format')!r} v{meta.get('format_version')!r}")
        for key in ("camera_field", "observation_spec", "graph", "threshold"):
            if key not in meta:
                raise ClassifierError(f"{label}: {key}: missing")
        self.meta = dict(meta)
        self.camera_field = meta["camera_field"]
        try:
            self.observation_spec = DictSpec.from_msg(meta["observation_spec"])
        except (SpecError, KeyError, TypeError, ValueError) as err:
            raise ClassifierError(f"{label}: observation_spec: {err}") from None
        if list(self.observation_spec) != [self.camera_field]:
            raise ClassifierError(f"{label}: observation_spec: holds {list(self.observation_spec)}; expected "
                                  f"only the camera field {self.camera_field!r}")
        spec = self.observation_spec[self.camera_field]
        if len(spec.shape) != 3 or np.dtype(spec.dtype) != np.uint8:
            raise ClassifierError(f"{label}: camera_field {self.camera_field!r} is {spec.dtype}{list(spec.shape)}, "
                                  "not an HxWxC uint8 image")
        self.input_shape: tuple[int, int, int] = tuple(spec.shape)
        threshold = meta["threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
            raise ClassifierError(f"{label}: threshold: expected a number between 0 and 1, got {threshold!r}")
        self.threshold = float(threshold)
        self.metrics = dict(meta.get("metrics") or {})
        if not isinstance(meta["graph"], list):
            raise ClassifierError(f"{label}: graph: expected a list of ops, got {type(meta['graph']).__name__}")
        try:
            self.network = Graph(meta["graph"], self.observation_spec)
            self.arrays, width = self.network.checked_arrays(arrays)
        except ExportError as err:
            raise ClassifierError(f"{label}: {err}") from None
        if width != 1:
            raise ClassifierError(f"{label}: the graph outputs {width} values; a classifier outputs one logit")

    def logit(self, observation: Mapping[str, np.ndarray]) -> np.ndarray:
        """The logit of success; the camera field may carry leading batch axes (the result has them)."""
        if self.camera_field not in observation:
            raise KeyError(f"observation lacks the classifier's camera field {self.camera_field!r}")
        frame = np.asarray(observation[self.camera_field])
        if frame.ndim < 3 or frame.shape[-3:] != self.input_shape:
            raise ValueError(f"{self.camera_field}: shape {frame.shape}; the classifier reads {self.input_shape}")
        x, _ = self.network.run(self.arrays, {self.camera_field: frame})
        return x[..., 0]

    def __call__(self, observation: Mapping[str, np.ndarray]) -> float | np.ndarray:
        """The probability of success in [0, 1]: a float for one frame, an array for a batch."""
        p = sigmoid(self.logit(observation))
        return float(p) if p.ndim == 0 else p

    def success(self, observation: Mapping[str, np.ndarray]) -> bool:
        """Whether one frame reaches the threshold."""
        return bool(self(observation) >= self.threshold)


def save_classifier(directory: str | Path, meta: Mapping, arrays: Mapping[str, np.ndarray]) -> tuple[Path, Path]:
    """Write ``DIR/classifier.json`` and ``DIR/classifier.npz`` (refusing what :func:`load_classifier`
    would refuse)."""
    directory = Path(directory)
    SuccessClassifier(meta, arrays, str(directory))
    directory.mkdir(parents=True, exist_ok=True)
    json_path, npz_path = directory / JSON_FILE, directory / NPZ_FILE
    json_path.write_text(json.dumps(dict(meta), indent=1) + "\n")
    with open(npz_path, "wb") as f:
        np.savez(f, **{k: np.asarray(v, np.float32) for k, v in arrays.items()})
    return json_path, npz_path


def load_classifier(directory: str | Path) -> SuccessClassifier:
    """The classifier ``embodyrl reward train`` wrote into ``directory``; :class:`ClassifierError`
    naming the file and what is wrong otherwise."""
    directory = Path(directory)
    json_path, npz_path = directory / JSON_FILE, directory / NPZ_FILE
    for path in (json_path, npz_path):
        if not path.is_file():
            raise ClassifierError(f"{directory}: no {path.name} (a classifier is written by embodyrl reward train)")
    try:
        meta = json.loads(json_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ClassifierError(f"{json_path}: not JSON ({err})") from None
    if not isinstance(meta, dict):
        raise ClassifierError(f"{json_path}: expected a JSON object")
    try:
        with np.load(npz_path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise ClassifierError(f"{npz_path}: not a readable array file ({err})") from None
    return SuccessClassifier(meta, arrays, str(directory))
