"""What every learning algorithm offers the learner, the actors, evaluation and export.

An algorithm is its registry name, its resolved settings and pure functions
over pytrees: build networks and a training state, update the state from
batches, act, and write its policy for the numpy runtime. The learner, the
actors, ``embodyrl eval`` and ``embodyrl export`` only ever call this
interface, so none of them tests which algorithm it holds. Each algorithm
package implements it with a small adapter (``algos/ddpg/algorithm.py``...)
and lists its :class:`Entry` for :mod:`embodyrl.algos.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

CONTINUOUS, DISCRETE = "continuous", "discrete"
"""The action spaces: real vectors within bounds, or one integer choice in [0, n-1]."""


@runtime_checkable
class Algorithm(Protocol):
    """A learning algorithm with its settings resolved, behind one interface.

    ``networks`` are static structure (graph definitions, specs) closed over by
    jitted functions; parameters and optimiser state live in ``state``, a pytree
    the learner checkpoints and donates to the update. The actor side needs only
    ``actor_params`` (what the learner publishes under the ``actor`` prefix).
    """

    name: str
    """The registry name (``td3``): what config.json's ``algorithm`` and policy.json record."""
    config: Any
    """The resolved settings: the config section with the variant's options applied (TD3's, RLPD's)."""
    on_policy: bool
    """True: learns from rollouts of its current weights (no replay; stale rows are dropped or corrected)."""
    action_spaces: frozenset[str]
    """The action spaces it can act in (:data:`CONTINUOUS`, :data:`DISCRETE`)."""
    batch_size: int
    """Transitions per gradient step (on-policy: samples per iteration)."""
    discount: float
    """gamma, which the replay's n-step returns use as well."""

    def init(self, key, observation_spec, action_spec) -> tuple[Any, Any]:
        """(networks, training state) with fresh parameters for these specs."""

    def make_update_many(self, networks) -> Callable[[Any, Any], tuple[Any, dict]]:
        """``update_many(state, batches) -> (state, metrics)``, pure and jittable. Off-policy: K
        steps scanned over batches stacked ``[K, batch, ...]`` as the replay samples them, each
        sample's loss weighted by ``batches["weight"]`` where present (prioritised replay's
        importance weights; absent: ones), and then ``metrics["td_error"]`` per sample
        (``[K, batch]``, the rows' new priorities); on-policy: one iteration over a time-major rollout batch ``[T, B, ...]``."""

    def actor_networks(self, observation_spec, action_spec, key) -> tuple[Any, Any]:
        """(networks, fresh actor parameters): what an actor needs to act before any weights arrive."""

    def actor_params(self, state) -> Any:
        """The actor's parameters in ``state``: what the learner publishes and saves."""

    def act(self, networks, actor_params, observation, key, explore: bool) -> tuple[Any, dict]:
        """(batched action, extras such as ``log_prob``), exploring or not."""

    def mean_action(self, networks, actor_params, observation) -> Any:
        """The deterministic action (evaluation, export parity)."""

    def export(self, networks, actor_params, version) -> tuple[dict, dict]:
        """(meta, arrays) of the policy for the numpy runtime (:mod:`embodyrl.hal.runtime`)."""


@dataclass(frozen=True)
class Configured:
    """An adapter's shared half: its registry name and settings, which hold batch size and discount."""

    name: str
    config: Any

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def discount(self) -> float:
        return self.config.discount


@dataclass(frozen=True)
class Entry:
    """One registered algorithm: its name, where its settings live, and how to build it."""

    name: str
    """What ``--algorithm`` and config.json's ``algorithm`` say (``td3``)."""
    section: str
    """The TrainConfig section holding its settings (``ddpg`` for both ddpg and td3)."""
    config_type: type
    """The section's dataclass."""
    build: Callable[[Any], Algorithm]
    """The algorithm from the section's settings (applying the variant's options)."""
    heterogeneous: bool = False
    """Whether it trains one policy over several device kinds (:func:`embodyrl.algos.heads.over`):
    the algorithm then provides ``headed_networks``, ``initial_state`` and ``policy_head``."""
    shard_by: str | None = "batch_size"
    """The section's setting that sizes the batch axis an update splits over several devices
    (``learner.devices``; it must divide by their count). None: its update cannot be split, and a
    run on several devices is refused at start."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Settings outside its section that it implies (PPO: actors take no random warm-up), applied when
    the config is built to every key the user did not set (:func:`embodyrl.config.apply_algorithm_defaults`)."""


def action_space(action_spec) -> str:
    """:data:`DISCRETE` for an integer action (one choice among n), else :data:`CONTINUOUS`."""
    return DISCRETE if np.dtype(action_spec.dtype).kind in "iu" else CONTINUOUS


def refusal(algorithm: Algorithm, action_spec) -> str | None:
    """Why ``algorithm`` cannot act in ``action_spec``'s space (None when it can)."""
    space = action_space(action_spec)
    if space in algorithm.action_spaces:
        return None
    return (f"{algorithm.name} acts on {' or '.join(sorted(algorithm.action_spaces))} actions; "
            f"the task's action {action_spec.name!r} is {space}")
