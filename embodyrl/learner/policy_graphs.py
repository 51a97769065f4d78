"""Each device's policy as the numpy runtime's export, for actors that act without JAX.

A robot PC with the base install (numpy, pyzmq) cannot build the learner's
networks. It says so in its HELLO (``policy_graphs``), and its WELCOME
carries, for each device it declared, the same ``(meta, arrays)`` that
``embodyrl export`` writes (:func:`embodyrl.algos.heads.export_device`); the
actor acts with :class:`~embodyrl.hal.runtime.NumpyPolicy` and follows the
WEIGHTS that come after, as a JAX actor does. An export is built on the first
ask for its device kind, from the weights published then, and kept: the graph
never changes within a run, and the weights sent right after every WELCOME
are the newest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from ..algos.heads import export_device
from ..hal import params as flat_params
from ..hal.layout import Layout
from ..hal.steps import PolicyVersion

log = logging.getLogger(__name__)


class PolicyGraphs:
    """``graphs(device_id)``: ``(meta, arrays)`` of that device's policy, or raises ``ValueError`` naming why
    there is none (a network the numpy runtime lacks an op for)."""

    def __init__(self, algorithm, layout: Layout, published: Callable[[], tuple[PolicyVersion, dict]]):
        self.algorithm, self.layout, self.published = algorithm, layout, published
        self._by_kind: dict[int, tuple[dict, dict[str, np.ndarray]] | ValueError] = {}

    def __call__(self, device_id: int) -> tuple[dict, dict[str, np.ndarray]]:
        kind = self.layout.kind_of(device_id)
        if not 0 <= kind < len(self.layout.kinds):
            raise ValueError(f"device {device_id} is not in this learner's layout")
        if kind not in self._by_kind:
            self._by_kind[kind] = self._export(kind)
        export = self._by_kind[kind]
        if isinstance(export, ValueError):
            raise export
        return export

    def _export(self, kind: int):
        version, weights = self.published()
        params = flat_params.unflatten(flat_params.subtree(weights, "actor"))
        try:
            meta, arrays = export_device(self.algorithm, self.layout, params, kind, version)
        except Exception as err:  # noqa: BLE001 - an actor's ask never stops the learner; it hears why
            log.warning("learner: no numpy policy for device kind %r: %s", self.layout.kinds[kind].name, err)
            return ValueError(f"the learner cannot export {self.layout.kinds[kind].name!r}'s policy for the "
                              f"numpy runtime ({err}); act with JAX: pip install 'embodyrl[learner]'")
        return meta, {name: np.ascontiguousarray(a) for name, a in arrays.items()}
