"""Fit the success classifier: balanced batches, augmentation, Adam on the binary cross-entropy.

Positives are rare (the last few frames of the successful episodes), so each
batch draws half its frames from the positives and half from the negatives
(with replacement): the class balancing HIL-SERL's classifier needs, with
an unweighted loss. Each frame is shifted at random by up to
``augment_pad`` pixels (DrQ's :func:`~embodyrl.algos.encoders.random_shift`)
and its brightness scaled by a factor in [1 - b, 1 + b]. ``update`` is one
pure, jitted step: ``update(state, images, labels, key) -> (state, loss)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ..algos.encoders import random_shift
from .dataset import Frames
from .model import ClassifierConfig, logits, make_model


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    """Gradient steps."""
    batch_size: int = 64
    """Frames per step, half positive and half negative."""
    lr: float = 1e-3
    """Adam's learning rate."""
    seed: int = 0
    """Initial parameters, batches and augmentation."""
    augment_pad: int | None = None
    """Random shift of at most this many pixels (0: none; None: 1/20 of the smaller side, 4 at 84x84)."""
    brightness: float = 0.1
    """Brightness scaled by a factor in [1 - brightness, 1 + brightness] (0: none)."""
    model: ClassifierConfig = field(default_factory=ClassifierConfig)

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 2 or self.lr <= 0:
            raise ValueError("steps must be >= 1, batch_size >= 2 and lr > 0")
        if not 0 <= self.brightness < 1 or (self.augment_pad is not None and self.augment_pad < 0):
            raise ValueError("brightness must be in [0, 1) and augment_pad >= 0")


class TrainState(NamedTuple):
    params: dict
    opt_state: optax.OptState


def pad_of(config: TrainConfig, image_shape: tuple[int, ...]) -> int:
    return config.augment_pad if config.augment_pad is not None else round(min(image_shape[:2]) / 20)


def augment(images: jax.Array, key: jax.Array, pad: int, brightness: float) -> jax.Array:
    """uint8 [N, H, W, C] -> float32 in [0, 1], randomly shifted and brightened per image."""
    shift_key, light_key = jax.random.split(key)
    if pad > 0:
        offsets = jax.random.randint(shift_key, (images.shape[0], 2), 0, 2 * pad + 1)
        images = random_shift(images, offsets, pad)
    x = images.astype(jnp.float32) / 255.0
    if brightness > 0:
        scale = jax.random.uniform(light_key, (images.shape[0], 1, 1, 1), minval=1 - brightness,
                                   maxval=1 + brightness)
        x = jnp.clip(x * scale, 0.0, 1.0)
    return x


def make_update(graph: nnx.GraphDef, optimizer: optax.GradientTransformation, pad: int, brightness: float):
    """The jitted step ``(state, images uint8 [B, H, W, C], labels [B], key) -> (state, loss)``."""

    def loss_fn(params, images, labels):
        return optax.sigmoid_binary_cross_entropy(logits(graph, params, images), labels).mean()

    @partial(jax.jit, donate_argnums=0)
    def update(state: TrainState, images, labels, key):
        x = augment(images, key, pad, brightness)
        loss, grads = jax.value_and_grad(loss_fn)(state.params, x, labels.astype(jnp.float32))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return TrainState(optax.apply_updates(state.params, updates), opt_state), loss

    return update


def fit(frames: Frames, config: TrainConfig) -> tuple[nnx.GraphDef, dict, dict]:
    """(graph, params, figures): the classifier trained on ``frames``, which must hold both classes."""
    positives, negatives = np.flatnonzero(frames.labels), np.flatnonzero(~frames.labels)
    if positives.size == 0 or negatives.size == 0:
        raise ValueError(f"training needs positive and negative frames; got {positives.size} and {negatives.size}")
    shape = frames.images.shape[1:]
    graph, params = make_model(shape, config.model, config.seed)
    optimizer = optax.adam(config.lr)
    state = TrainState(params, optimizer.init(params))
    update = make_update(graph, optimizer, pad_of(config, shape), config.brightness)
    rng = np.random.default_rng(config.seed)
    keys = jax.random.split(jax.random.key(config.seed + 1), config.steps)
    half = config.batch_size // 2
    labels = np.r_[np.ones(half, bool), np.zeros(config.batch_size - half, bool)]
    started, losses = time.perf_counter(), []
    for step in range(config.steps):
        rows = np.r_[rng.choice(positives, half), rng.choice(negatives, config.batch_size - half)]
        state, loss = update(state, frames.images[rows], labels, keys[step])
        losses.append(loss)
    last = float(np.mean(jax.device_get(losses[-min(50, len(losses)):])))
    seconds = time.perf_counter() - started
    return graph, state.params, {"steps": config.steps, "train_time_s": round(seconds, 3), "final_loss": last}


def probabilities(graph: nnx.GraphDef, params, images: np.ndarray, batch: int = 256) -> np.ndarray:
    """P(success) of uint8 frames [N, H, W, C], without augmentation (batches of one size: one compile)."""
    forward = _forward(graph)
    parts = []
    for i in range(0, len(images), batch):
        chunk = images[i:i + batch]
        padded = np.concatenate([chunk, np.zeros((batch - len(chunk), *chunk.shape[1:]), chunk.dtype)])
        parts.append(np.asarray(forward(params, padded))[:len(chunk)])
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


_FORWARD: dict = {}


def _forward(graph: nnx.GraphDef):
    """The jitted sigmoid of the logits, one per network structure."""
    if graph not in _FORWARD:
        _FORWARD[graph] = jax.jit(lambda p, x: jax.nn.sigmoid(logits(graph, p, x)))
    return _FORWARD[graph]


def scores(probs: np.ndarray, labels: np.ndarray, threshold: float) -> dict:
    """Precision, recall, accuracy and F1 of ``probs >= threshold`` (None where undefined)."""
    predicted = probs >= threshold
    tp = int(np.sum(predicted & labels))
    fp, fn = int(np.sum(predicted & ~labels)), int(np.sum(~predicted & labels))
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
    return {"precision": precision, "recall": recall, "f1": f1,
            "accuracy": float(np.mean(predicted == labels)) if len(labels) else None,
            "true_positives": tp, "false_positives": fp, "false_negatives": fn}


def best_f1_threshold(probs: np.ndarray, labels: np.ndarray) -> float:
    """The threshold among 0.01 ... 0.99 with the best F1 on (probs, labels); ties go to the one
    nearest 0.5."""
    grid = np.round(np.linspace(0.01, 0.99, 99), 2)
    f1 = np.array([scores(probs, labels, t)["f1"] or 0.0 for t in grid])
    best = np.flatnonzero(f1 == f1.max())
    return float(grid[best[np.argmin(np.abs(grid[best] - 0.5))]])
