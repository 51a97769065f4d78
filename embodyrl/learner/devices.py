"""Which of its host's accelerators the learner's update runs on (``learner.devices``: 1, N or ``all``).

With more than one, each update's batch is split over the devices along its batch axis and the
training state is replicated (:func:`embodyrl.algos.parallel.data_parallel`): every device computes
the gradients of its share and XLA averages them, so the update equals the one-device update up to
float summation order, and the weights published to actors are the same.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..algos.parallel import batch_mesh

ALL = "all"


def resolve(setting: int | str) -> list:
    """The local devices ``setting`` names: ``all`` of them, or the first N."""
    local = jax.local_devices()
    if setting == ALL:
        return local
    try:
        count = int(setting)
    except (TypeError, ValueError):
        raise ValueError(f"learner.devices: expected a count or {ALL!r}, got {setting!r}") from None
    if not 1 <= count <= len(local):
        raise ValueError(f"learner.devices: {count} asked, this host has {len(local)} "
                         f"{local[0].platform} device{'s' if len(local) != 1 else ''}")
    return local[:count]


def check_batch(batch_size: int, devices: list) -> None:
    """Refuse a batch that does not split evenly: each device must hold the same share."""
    if batch_size % len(devices):
        raise ValueError(f"learner.devices: the batch size {batch_size} does not divide by the "
                         f"{len(devices)} devices; choose a batch size that is a multiple of {len(devices)}")


def replicate(tree, devices: list):
    """``tree`` placed whole on every one of ``devices``."""
    return jax.device_put(tree, NamedSharding(batch_mesh(devices), PartitionSpec()))
