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


def data_parallel(update_fn, mesh: Mesh | None = None, batch_axis: int = 0, donate_state: bool = True,
                  batch_size: int | None = None):
    """Jit ``update_fn(state, batch)`` with ``batch`` split along ``batch_axis`` over ``mesh``.

    For ``update_many`` (batches stacked [K, B, ...]) pass ``batch_axis=1``. The batch size must be
    divisible by the number of devices. With ``batch_size``, a leaf whose ``batch_axis`` is not of
    that size is split along its first axis that is (PPO's bootstrap observations, ``[B, ...]``), or
    else replicated: where a leaf is split changes only the layout, never the result.
    """
    mesh = mesh or batch_mesh()
    replicated = NamedSharding(mesh, PartitionSpec())

    def split(axis: int | None) -> NamedSharding:
        return replicated if axis is None else NamedSharding(mesh, PartitionSpec(*[None] * axis, "batch"))

    def leaf_sharding(leaf) -> NamedSharding:
        shape = np.shape(leaf)
        if len(shape) > batch_axis and shape[batch_axis] == batch_size:
            return split(batch_axis)
        return split(next((axis for axis, size in enumerate(shape) if size == batch_size), None))

    def jitted(batch_sharding):
        return jax.jit(update_fn, in_shardings=(replicated, batch_sharding), out_shardings=(replicated, replicated),
                       donate_argnums=0 if donate_state else ())

    if batch_size is None:
        whole = jitted(split(batch_axis))

        def run(state, batch):
            return whole(state, batch)
    else:
        compiled = {}

        def run(state, batch):
            layout = (jax.tree.structure(batch), tuple(np.shape(x) for x in jax.tree.leaves(batch)))
            if layout not in compiled:
                compiled[layout] = jitted(jax.tree.map(leaf_sharding, batch))
            return compiled[layout](state, batch)

    run.mesh = mesh
    return run
