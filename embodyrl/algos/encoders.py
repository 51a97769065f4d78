"""Observations to feature vectors: a convolutional encoder for camera images (DrQ / SAC-AE style).

Images are HxWxC uint8 fields (``camera/front``); they stay uint8 in replay
and in the sampled batch, and become float32 in [0, 1] here, on the
accelerator. The encoder is a few 3x3 convolutions with ReLU, then a linear
layer, LayerNorm and tanh to ``feature_dim`` values (Yarats et al. 2021,
"Image Augmentation Is All You Need", DrQ; and SAC-AE before it). State
fields are flattened and appended to the image features unless
``pixels_only`` drops them.

Sharing, as in DrQ: the critic owns the encoder and its loss trains it; the
actor reads the same weights with the gradient stopped (``detach``), so the
actor's loss never moves the encoder. ``random_shift`` is DrQ's
augmentation: pad each image by repeating its border, crop back at a random
offset, independently per image, inside the jitted update.

The encoder is opt-in (``encoder.image_fields``, or ``["auto"]`` for every
HxWxC uint8 field); without it :func:`make_encoder` returns ``None`` and the
networks flatten the observation as before.

``encoder.ignore_fields`` are fields no network reads (a camera only the
reward's classifier looks at): :func:`network_inputs` drops them from the
spec the networks, their input width and the export are built on, and is the
one place that does. The device still sends them and the replay still
stores them; a batch may carry them, the networks never index them (and
``jax.jit`` does not move an argument the update never reads to the device).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..hal.specs import DictSpec
from .conv import conv as conv2d
from .encoder_config import EncoderConfig
from .networks import flatten_observation


def network_inputs(observation_spec: DictSpec, config: EncoderConfig, section: str = "encoder") -> DictSpec:
    """The fields the networks read: ``observation_spec`` without ``config.ignore_fields``. Refused,
    naming the field and ``section`` (``sac.encoder``): a name that is not a field, a field also in
    ``image_fields``, or ignoring every field."""
    for name in config.ignore_fields:
        if name not in observation_spec:
            raise ValueError(f"{section}.ignore_fields: {name!r} is not an observation field; "
                             f"fields: {list(observation_spec)}")
        if name in config.image_fields:
            raise ValueError(f"{section}: {name!r} is in both image_fields and ignore_fields")
    if not config.ignore_fields:
        return observation_spec
    kept = tuple(s for s in observation_spec.specs if s.name not in config.ignore_fields)
    if not kept:
        raise ValueError(f"{section}.ignore_fields: every observation field is ignored; the networks need one")
    return DictSpec(kept)


def image_fields(spec: DictSpec, config: EncoderConfig, section: str = "encoder") -> tuple[str, ...]:
    """The fields of ``spec`` (the fields read) the encoder reads: the configured ones (checked),
    every HxWxC uint8 field for ``("auto",)``, none when empty."""
    if config.image_fields == ("auto",):
        return tuple(s.name for s in spec.specs if len(s.shape) == 3 and np.dtype(s.dtype) == np.uint8)
    if config.image_fields:
        for name in config.image_fields:
            if name not in spec:
                raise ValueError(f"{section}.image_fields: {name!r} is not an observation field; "
                                 f"fields: {list(spec)}")
            if len(spec[name].shape) != 3:
                raise ValueError(f"{section}.image_fields: {name!r} has shape {spec[name].shape}, not HxWxC")
        return tuple(config.image_fields)
    return ()


def conv_stack(image_shape: tuple[int, int, int], channels: tuple[int, ...], strides: tuple[int, ...],
               rngs: nnx.Rngs, what: str = "encoder") -> tuple[nnx.List, int]:
    """VALID 3x3 convolutions (``nnx.Conv`` layers holding the parameters) and the width of their
    flattened output; an image too small for them is refused, naming ``what``."""
    height, width, depth = image_shape
    convs = []
    for out, stride in zip(channels, strides, strict=True):
        convs.append(nnx.Conv(depth, out, kernel_size=(3, 3), strides=(stride, stride), padding="VALID",
                              rngs=rngs))
        height, width, depth = (height - 3) // stride + 1, (width - 3) // stride + 1, out
        if height < 1 or width < 1:
            raise ValueError(f"{what}: image {tuple(image_shape)} is too small for {len(channels)} "
                             f"convolutions with strides {tuple(strides)}")
    return nnx.List(convs), height * width * depth


def apply_convs(convs: nnx.List, x: jax.Array) -> jax.Array:
    """The convolutions with ReLU, through :func:`embodyrl.algos.conv.conv` (fast gradients on XLA:CPU)."""
    for conv in convs:
        x = jax.nn.relu(conv2d(x, conv.kernel[...], conv.strides[0]) + conv.bias[...])
    return x


class ConvEncoder(nnx.Module):
    """3x3 convolutions (VALID, ReLU), then linear -> LayerNorm -> tanh.

    The convolutions hold their parameters in ``nnx.Conv`` layers but run through
    :func:`embodyrl.algos.conv.conv`: the same forward, with a gradient that stays fast
    inside the learner's ``lax.scan`` on XLA:CPU."""

    def __init__(self, image_shape: tuple[int, int, int], config: EncoderConfig, *, rngs: nnx.Rngs):
        self.convs, flat = conv_stack(image_shape, config.channels, config.strides, rngs)
        self.linear = nnx.Linear(flat, config.feature_dim, rngs=rngs)
        self.norm = nnx.LayerNorm(config.feature_dim, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        """``images``: float32 [N, H, W, C] in [0, 1] -> [N, feature_dim]."""
        x = apply_convs(self.convs, images)
        return jnp.tanh(self.norm(self.linear(x.reshape(x.shape[0], -1))))


@dataclass(frozen=True, eq=False)
class ObservationEncoder:
    """Static structure of the encoder; its parameters live in the critic's (and the actor's copy)."""

    observation_spec: DictSpec
    image_fields: tuple[str, ...]
    state_fields: tuple[str, ...]
    graph: nnx.GraphDef
    config: EncoderConfig

    @property
    def image_shape(self) -> tuple[int, ...]:
        return _stacked_shape(self.observation_spec, self.image_fields)

    @property
    def size(self) -> int:
        """Width of the features the networks see."""
        return self.config.feature_dim + sum(self.observation_spec[f].size for f in self.state_fields)

    def images(self, observation) -> jax.Array:
        """The image fields as one uint8 array [..., H, W, sum of C]."""
        return jnp.concatenate([jnp.asarray(observation[f]) for f in self.image_fields], axis=-1)

    def __call__(self, params, observation) -> jax.Array:
        """float32 features [..., size]: image features, then the flattened state fields."""
        images = self.images(observation)
        lead = images.shape[:-3]
        scaled = images.reshape(-1, *images.shape[-3:]).astype(jnp.float32) / 255.0
        features = nnx.merge(self.graph, params)(scaled).reshape(*lead, self.config.feature_dim)
        parts = [features]
        for name in self.state_fields:
            x = jnp.asarray(observation[name], jnp.float32)
            spec = self.observation_spec[name]
            parts.append(x.reshape(*x.shape[: x.ndim - len(spec.shape)], spec.size))
        return jnp.concatenate(parts, axis=-1)

    def augment(self, key: jax.Array, observation: dict) -> dict:
        """The observation with every image field randomly shifted (one offset per image, shared
        across fields of the same row); other fields unchanged."""
        if self.config.augment_pad == 0:
            return observation
        first = jnp.asarray(observation[self.image_fields[0]])
        offsets = jax.random.randint(key, (*first.shape[:-3], 2), 0, 2 * self.config.augment_pad + 1)
        out = dict(observation)
        for name in self.image_fields:
            out[name] = random_shift(jnp.asarray(observation[name]), offsets, self.config.augment_pad)
        return out


def random_shift(images: jax.Array, offsets: jax.Array, pad: int) -> jax.Array:
    """``images`` [..., H, W, C] padded by ``pad`` (edge pixels repeated) and cropped back to HxW
    at ``offsets`` [..., 2] (row, column) in [0, 2 * pad]: a shift of at most ``pad`` pixels."""
    lead = images.shape[:-3]
    height, width, channels = images.shape[-3:]
    flat = images.reshape(-1, height, width, channels)
    padded = jnp.pad(flat, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge")

    def crop(image, offset):
        return jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (height, width, channels))

    return jax.vmap(crop)(padded, offsets.reshape(-1, 2)).reshape(*lead, height, width, channels)


MIN_CAMERA_SIDE = 32
"""A uint8 HxWxC field at least this high and wide is a camera image, not a feature vector."""


def check_images(observation_spec: DictSpec, config: EncoderConfig, section: str = "encoder") -> None:
    """Refuse, naming the field and the fix, to flatten a camera image into the MLP (and refuse
    ``ignore_fields`` that :func:`network_inputs` refuses).

    With ``image_fields`` empty every field read is flattened; for an 84x84 camera that is a
    21k-wide input layer that does not learn, silently. Small uint8 grids still flatten; an
    ignored camera is not read at all.
    """
    inputs = network_inputs(observation_spec, config, section)
    if config.image_fields:
        return
    for spec in inputs.specs:
        if (len(spec.shape) == 3 and np.dtype(spec.dtype) == np.uint8
                and min(spec.shape[:2]) >= MIN_CAMERA_SIDE):
            raise ValueError(f"observation field {spec.name!r} is a camera image ({'x'.join(map(str, spec.shape))} "
                             f"uint8): set {section}.image_fields to [auto] to read it with the convolutional "
                             f"encoder, or list it in {section}.ignore_fields if no network should read it")


def make_encoder(observation_spec: DictSpec, config: EncoderConfig, key: jax.Array, section: str = "encoder"):
    """(encoder, params), or (None, None) when the fields read have no image fields. The encoder
    reads only the fields :func:`network_inputs` keeps (its ``observation_spec`` is theirs)."""
    check_images(observation_spec, config, section)
    inputs = network_inputs(observation_spec, config, section)
    images = image_fields(inputs, config, section)
    if not images:
        return None, None
    state = () if config.pixels_only else tuple(s.name for s in inputs.specs if s.name not in images)
    shape = _stacked_shape(inputs, images)
    graph, params = nnx.split(ConvEncoder(shape, config, rngs=nnx.Rngs(key)))
    encoder = ObservationEncoder(inputs, images, state, graph, config)
    return encoder, nnx.to_pure_dict(params)


def _stacked_shape(spec: DictSpec, fields: tuple[str, ...]) -> tuple[int, int, int]:
    shapes = [spec[f].shape for f in fields]
    if any(s[:2] != shapes[0][:2] for s in shapes):
        raise ValueError(f"encoder: image fields {list(fields)} differ in height/width: {shapes}")
    return (*shapes[0][:2], sum(s[2] for s in shapes))


def detach(params: dict) -> dict:
    """``params`` with the encoder's gradient stopped: the actor reads the critic's features."""
    return {**params, "encoder": jax.lax.stop_gradient(params["encoder"])}


def share(actor_params: dict, critic_params: dict) -> dict:
    """The actor's parameters with the critic's (trained) encoder copied in."""
    return {**actor_params, "encoder": critic_params["encoder"]}


def augment_batch(encoder: ObservationEncoder, batch: dict, key: jax.Array) -> dict:
    """DrQ: independent random shifts of a sampled batch's observations and next observations."""
    obs_key, next_key = jax.random.split(key)
    return {**batch, "observation": encoder.augment(obs_key, batch["observation"]),
            "next_observation": encoder.augment(next_key, batch["next_observation"])}


def features(encoder: ObservationEncoder | None, spec: DictSpec, params, observation, body: str):
    """(features, the body's parameters): with an encoder, ``params`` is ``{"encoder": ..., body: ...}``;
    without one, the flattened observation and ``params`` themselves."""
    if encoder is None:
        return flatten_observation(observation, spec), params
    return encoder(params["encoder"], observation), params[body]


def export_ops(encoder: ObservationEncoder, params, prefix: str) -> list[dict]:
    """The encoder as numpy-runtime ops (:mod:`embodyrl.hal.runtime`): image, conv2d + relu per layer,
    flatten, dense, layer_norm, tanh, then the state fields appended; arrays named ``prefix/...``."""
    module = nnx.merge(encoder.graph, params)
    ops: list[dict] = [{"op": "image", "fields": list(encoder.image_fields)}]
    for i, stride in enumerate(encoder.config.strides):
        ops += [{"op": "conv2d", "kernel": f"{prefix}/convs/{i}/kernel", "bias": f"{prefix}/convs/{i}/bias",
                 "stride": int(stride)}, {"op": "relu"}]
    ops += [{"op": "flatten"}, {"op": "dense", "kernel": f"{prefix}/linear/kernel", "bias": f"{prefix}/linear/bias"},
            {"op": "layer_norm", "scale": f"{prefix}/norm/scale", "bias": f"{prefix}/norm/bias",
             "epsilon": float(module.norm.epsilon)}, {"op": "tanh"}]
    if encoder.state_fields:
        ops.append({"op": "append", "fields": list(encoder.state_fields)})
    return ops
