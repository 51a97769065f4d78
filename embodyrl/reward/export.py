"""The trained classifier as the numpy runtime's export (format: :mod:`embodyrl.hal.classifier`)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from ..hal import classifier
from ..hal import params as flat_params
from ..hal.specs import DictSpec
from .model import ClassifierConfig, export_ops


def export(params, camera_field: str, observation_spec: DictSpec, config: ClassifierConfig, *,
           threshold: float = 0.5, threshold_from: str = "given",
           metrics: dict | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, float32 arrays) of a trained :class:`~embodyrl.reward.model.SuccessCNN`."""
    meta = {"format": classifier.FORMAT, "format_version": classifier.FORMAT_VERSION,
            "camera_field": camera_field, "observation_spec": observation_spec.to_msg(),
            "graph": export_ops(camera_field, config), "threshold": float(threshold),
            "threshold_from": threshold_from, "metrics": metrics or {}}
    arrays = {k: np.asarray(v, np.float32) for k, v in flat_params.flatten(jax.device_get(params)).items()}
    return meta, arrays


def write(directory: str | Path, meta: dict, arrays: dict[str, np.ndarray]) -> tuple[Path, Path]:
    """``DIR/classifier.json`` and ``DIR/classifier.npz``, checked by the numpy loader first."""
    return classifier.save_classifier(directory, meta, arrays)
