"""Which accelerators the learner's update runs on: ``learner.devices`` (1, N or ``all``) of each
host, over ``learner.hosts`` learner processes (:mod:`.hosts`).

With more than one device in all, each update's batch is split over the devices along its batch
axis (axis 1: ``[calls, batch, ...]``, or PPO's ``[time, rollouts, ...]``) and the training state
is replicated (:func:`embodyrl.algos.parallel.data_parallel`): every device computes the gradients
of its share and XLA averages them, so the update equals the one-device update up to float
summation order, and the weights published to actors are the same. Over several hosts, each host
brings its share of the global batch from its own replay.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..algos.parallel import data_parallel

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


def check_batch(batch_size: int, devices: int, setting: str = "batch size") -> None:
    """Refuse a batch that does not split evenly: each device must hold the same share."""
    if batch_size % devices:
        raise ValueError(f"learner.devices: the {setting} {batch_size} does not divide by the "
                         f"{devices} devices; choose a multiple of {devices}")


class Placement:
    """Where the state and batches live: one device, or a mesh over the chosen devices of every
    host (ordered host by host, so host ``i``'s rows are the ``i``-th slice of the global batch)."""

    def __init__(self, local_devices: list | None = None, *, hosts: int = 1, host_index: int = 0,
                 batch_size: int | None = None):
        """``batch_size``: the global batch's size along its batch axis (where a batch leaf has it
        elsewhere, that axis is split instead: :func:`~embodyrl.algos.parallel.data_parallel`)."""
        self.hosts, self.host_index, self.batch_size = hosts, host_index, batch_size
        local_devices = local_devices or jax.local_devices()[:1]
        if hosts > 1:  # every host chose as many; their devices are the global ones of those indices
            count = len(local_devices)
            by_host = {}
            for device in jax.devices():
                by_host.setdefault(device.process_index, []).append(device)
            devices = [d for index in sorted(by_host) for d in by_host[index][:count]]
        else:
            devices = list(local_devices)
        self.devices = devices
        self.mesh = Mesh(np.asarray(devices), ("batch",))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.sharded = NamedSharding(self.mesh, PartitionSpec(None, "batch"))

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def single(self) -> bool:
        return self.count == 1

    def jit(self, update):
        """``update(state, batch)`` compiled for this placement (the state donated)."""
        if self.single:
            return jax.jit(update, donate_argnums=0)
        return data_parallel(update, self.mesh, batch_axis=1, batch_size=self.batch_size)

    def state(self, tree):
        """``tree`` (the same on every host) placed whole on every device."""
        if self.single:
            return tree
        if self.hosts == 1:
            return jax.device_put(tree, self.replicated)

        def everywhere(x):
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                return jax.random.wrap_key_data(everywhere(jax.random.key_data(x)))
            x = np.asarray(x)
            return jax.make_array_from_process_local_data(self.replicated, x, x.shape)

        return jax.tree.map(everywhere, self.local(tree))

    def batch(self, tree):
        """This host's share of a batch as the global batch (host-local arrays pass through: the
        compiled update splits them over the local devices itself)."""
        if self.hosts == 1:
            return tree

        def global_batch(x):
            x = np.asarray(x)
            shape = (x.shape[0], x.shape[1] * self.hosts, *x.shape[2:])
            return jax.make_array_from_process_local_data(self.sharded, x, shape)

        return jax.tree.map(global_batch, tree)

    def local(self, tree):
        """A replicated result as this host's plain arrays (a global array is not fetched whole)."""
        def fetch(x):
            if isinstance(x, jax.Array) and not x.is_fully_addressable:
                return x.addressable_data(0)
            return x

        return jax.tree.map(fetch, tree)

    def mine(self, per_row):
        """This host's slice of a ``[calls, batch]`` result fetched by :meth:`local` (TD errors)."""
        if self.hosts == 1:
            return per_row  # left on the device: the replay reads it when the next batch is taken
        per_row = np.asarray(per_row)
        share = per_row.shape[1] // self.hosts
        return per_row[:, self.host_index * share:(self.host_index + 1) * share]
