"""Data-parallel updates: the batch sharded over every local device, the state replicated.

``jax.jit`` with sharding annotations lets XLA partition the update: each
device computes gradients on its shard of the batch and the mean is reduced
across devices, so the result equals the single-device update up to float
summation order. Across hosts, call ``jax.distributed.initialize()`` first:
``jax.devices()`` then spans every host's devices and the same code runs.
Nothing here assumes CPU or GPU.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def batch_mesh(devices=None) -> Mesh:
    devices = np.asarray(devices if devices is not None else jax.devices())
    return Mesh(devices, ("batch",))


def data_parallel(update_fn, mesh: Mesh | None = None, batch_axis: int = 0, donate_state: bool = True):
    """Jit ``update_fn(state, batch)`` with ``batch`` split along ``batch_axis`` over ``mesh``.

    For ``update_many`` (batches stacked [K, B, ...]) pass ``batch_axis=1``.
    The batch size must be divisible by the number of devices.
    """
    mesh = mesh or batch_mesh()
    replicated = NamedSharding(mesh, PartitionSpec())
    spec = [None] * batch_axis + ["batch"]
    sharded = NamedSharding(mesh, PartitionSpec(*spec))
    jitted = jax.jit(update_fn, in_shardings=(replicated, sharded), out_shardings=(replicated, replicated),
                     donate_argnums=0 if donate_state else ())

    def run(state, batch):
        return jitted(state, batch)

    run.mesh = mesh
    return run
