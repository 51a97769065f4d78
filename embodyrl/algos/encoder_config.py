"""The image encoder's settings: plain data, so a config reads them without JAX (:mod:`.encoders` builds it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EncoderConfig:
    image_fields: tuple[str, ...] = ()
    """Observation fields the convolutions read (HxWxC, same HxW), e.g. ``camera/front``; ``["auto"]``:
    every uint8 field of rank 3 not ignored. Empty (the default): no encoder, every field read is flattened."""
    ignore_fields: tuple[str, ...] = ()
    """Fields no network reads: recorded and sent (the reward reads them at the edge), never an input."""
    pixels_only: bool = False
    """Drop the state fields: the networks see only the image features."""
    channels: tuple[int, ...] = (32, 32, 32, 32)
    """Output channels of each 3x3 convolution (SAC-AE / DrQ: four of 32)."""
    strides: tuple[int, ...] = (2, 1, 1, 1)
    """Stride of each convolution (same length as ``channels``)."""
    feature_dim: int = 50
    """Width of the image feature vector (linear + LayerNorm + tanh)."""
    augment_pad: int = 4
    """DrQ's random shift: pad by this many pixels, crop back at random (0: no augmentation)."""

    def __post_init__(self):
        if len(self.channels) != len(self.strides) or not self.channels:
            raise ValueError(f"encoder.channels {self.channels} and encoder.strides {self.strides} must be "
                             "non-empty and of the same length")
        if min(self.channels) < 1 or min(self.strides) < 1 or self.feature_dim < 1 or self.augment_pad < 0:
            raise ValueError("encoder: channels, strides and feature_dim must be positive, augment_pad >= 0")
