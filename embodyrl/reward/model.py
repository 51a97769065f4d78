"""The success classifier's network: 3x3 VALID convolutions with ReLU, flatten, dense, one logit.

Small on purpose: it runs on the robot PC every control step, through the
numpy runtime (:func:`export_ops` writes the same network as runtime ops).
The convolutions hold their parameters in ``nnx.Conv`` layers and run
through :func:`embodyrl.algos.conv.conv`, as the policies' image encoder
does: the same forward, a gradient that stays fast on XLA:CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..algos.encoders import apply_convs, conv_stack


@dataclass(frozen=True)
class ClassifierConfig:
    channels: tuple[int, ...] = (16, 32, 32)
    """Output channels of each 3x3 convolution."""
    strides: tuple[int, ...] = (2, 2, 1)
    """Stride of each convolution (same length as ``channels``)."""
    hidden: int = 64
    """Width of the dense layer between the convolutions and the logit."""

    def __post_init__(self):
        if not self.channels or len(self.channels) != len(self.strides):
            raise ValueError(f"channels {self.channels} and strides {self.strides} must be non-empty and of "
                             "the same length")
        if min(self.channels) < 1 or min(self.strides) < 1 or self.hidden < 1:
            raise ValueError("channels, strides and hidden must be positive")


class SuccessCNN(nnx.Module):
    """float32 images [N, H, W, C] in [0, 1] -> logits of success [N]."""

    def __init__(self, image_shape: tuple[int, int, int], config: ClassifierConfig, *, rngs: nnx.Rngs):
        self.convs, flat = conv_stack(image_shape, config.channels, config.strides, rngs, "classifier")
        self.hidden = nnx.Linear(flat, config.hidden, rngs=rngs)
        self.out = nnx.Linear(config.hidden, 1, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = apply_convs(self.convs, images)
        x = jax.nn.relu(self.hidden(x.reshape(x.shape[0], -1)))
        return self.out(x)[:, 0]


def make_model(image_shape: tuple[int, int, int], config: ClassifierConfig, seed: int):
    """(graph, params): the module's structure (traced, never run) and its parameters as a plain
    dict, drawn with numpy: LeCun-normal kernels (std sqrt(1 / fan-in), flax's default scale), zero
    biases. Drawing them eagerly with JAX compiles every initialiser, seconds on a small CPU."""
    graph, shapes = nnx.split(nnx.eval_shape(lambda: SuccessCNN(tuple(image_shape), config, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def draw(tree: dict) -> dict:
        out = {}
        for name, leaf in tree.items():
            if isinstance(leaf, dict):
                out[name] = draw(leaf)
            elif name == "kernel":
                out[name] = rng.normal(0.0, np.sqrt(1.0 / np.prod(leaf.shape[:-1])), leaf.shape).astype(np.float32)
            else:
                out[name] = np.zeros(leaf.shape, np.float32)
        return out

    return graph, jax.tree_util.tree_map(jnp.asarray, draw(nnx.to_pure_dict(shapes)))


def logits(graph: nnx.GraphDef, params, images: jax.Array) -> jax.Array:
    """Logits of uint8 (or [0, 1] float) images [N, H, W, C]."""
    if images.dtype == jnp.uint8:
        images = images.astype(jnp.float32) / 255.0
    return nnx.merge(graph, params)(images)


def export_ops(camera_field: str, config: ClassifierConfig) -> list[dict]:
    """The network as numpy-runtime ops (:class:`embodyrl.hal.runtime.Graph`), arrays named as the
    parameters are (``convs/0/kernel``, ``hidden/bias``, ``out/kernel``...)."""
    ops: list[dict] = [{"op": "image", "fields": [camera_field]}]
    for i, stride in enumerate(config.strides):
        ops += [{"op": "conv2d", "kernel": f"convs/{i}/kernel", "bias": f"convs/{i}/bias", "stride": int(stride)},
                {"op": "relu"}]
    return ops + [{"op": "flatten"}, {"op": "dense", "kernel": "hidden/kernel", "bias": "hidden/bias"},
                  {"op": "relu"}, {"op": "dense", "kernel": "out/kernel", "bias": "out/bias"}]
