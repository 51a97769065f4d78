"""Several learner hosts training one model (``learner.hosts``): ``jax.distributed``, and the loop's
decisions taken together.

Each host runs the whole learner service for its own actors, with its own replay, and brings its
share of every global batch (:class:`~.devices.Placement`). An update is a collective over every
host's devices, so the hosts must decide the same things at the same turn of the loop: whether
all can train now, whether the run is done (the step budget counts every host's steps), whether
a checkpoint is due. :meth:`Hosts.agree` answers those once per turn with one small all-reduce;
:class:`OneHost` answers them from this host alone at no cost.

If a host dies, ``jax.distributed``'s coordination service ends the others (it does not let a
collective wait forever); restart every host with the same command and each resumes from its own
checkpoint, which holds the same update count on every host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Turn:
    """What the hosts decided for one turn of the loop."""

    train: bool
    """Every host has a batch (and training is not paused anywhere)."""
    env_steps: int
    """Environment steps taken over every host."""
    stop: bool
    """Some host was asked to stop."""
    checkpoint: bool
    """Some host's checkpoint timer is due: all save at this same update count."""


class OneHost:
    """A learner alone: every decision is its own."""

    count, index = 1, 0

    def agree(self, *, ready: bool, env_steps: int, stop: bool, checkpoint: bool) -> Turn:
        return Turn(ready, env_steps, stop, checkpoint)

    def same(self, name: str, value: int) -> None:
        """Nothing to compare with."""


class Hosts:
    """This process as host ``index`` of ``count``, joined through ``jax.distributed``."""

    def __init__(self, count: int, index: int):
        import jax
        import jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.count, self.index = count, index
        firsts = {}
        for device in jax.devices():  # one device of each host carries its votes
            firsts.setdefault(device.process_index, device)
        self._vote_device = firsts[jax.process_index()]
        mesh = Mesh(np.asarray([firsts[i] for i in sorted(firsts)]), ("host",))
        self._sharding = NamedSharding(mesh, PartitionSpec("host"))
        self._jax = jax
        # columns: [all ready (min), steps (sum), stop (max), checkpoint due (max), a value to compare (min, max)]
        self._reduce = jax.jit(
            lambda votes: jnp.concatenate([votes[:, 0].min(keepdims=True), votes[:, 1].sum(keepdims=True),
                                           votes[:, 2:4].max(axis=0), votes[:, 4].min(keepdims=True),
                                           votes[:, 4].max(keepdims=True)]),
            out_shardings=NamedSharding(mesh, PartitionSpec()))

    def _all_reduce(self, votes: list[int]) -> np.ndarray:
        local = np.asarray([votes], np.int64)
        arrays = [self._jax.device_put(local, self._vote_device)]
        stacked = self._jax.make_array_from_single_device_arrays((self.count, len(votes)), self._sharding, arrays)
        return np.asarray(self._reduce(stacked).addressable_data(0))

    def agree(self, *, ready: bool, env_steps: int, stop: bool, checkpoint: bool) -> Turn:
        ready_all, steps, stop_any, checkpoint_any, _, _ = self._all_reduce(
            [int(ready), int(env_steps), int(stop), int(checkpoint), 0])
        return Turn(bool(ready_all), int(steps), bool(stop_any), bool(checkpoint_any))

    def same(self, name: str, value: int) -> None:
        """Refuse to go on unless every host holds the same ``value`` (a resumed update count)."""
        low, high = self._all_reduce([1, 0, 0, 0, int(value)])[4:]
        if low != high:
            raise RuntimeError(f"learner.hosts: the hosts disagree on {name} ({low} to {high}); "
                               f"resume every host from checkpoints of the same update count")


def join(config) -> OneHost | Hosts:
    """This learner's hosts from ``learner.hosts``, ``host_index`` and ``coordinator``: with more than
    one, ``jax.distributed`` is started here, before anything else touches JAX's backends."""
    if config.hosts == 1:
        return OneHost()
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU hosts; GPUs use NCCL
    jax.distributed.initialize(coordinator_address=config.coordinator, num_processes=config.hosts,
                               process_id=config.host_index)
    return Hosts(config.hosts, config.host_index)
