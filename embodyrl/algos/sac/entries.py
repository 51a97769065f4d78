"""SAC's registry entries (``sac``, ``rlpd``): plain data; the algorithm is imported when built."""

from __future__ import annotations

from ..interface import Entry
from .config import SECTION, SACConfig, rlpd

RLPD_MIX = {"demonstration": 0.5, "online": 0.5}
"""RLPD's symmetric sampling: half of every batch from demonstrations and interventions, half online."""


def _build(name: str):
    def build(config: SACConfig):
        from .algorithm import SAC

        return SAC(name, rlpd(config) if name == "rlpd" else config)

    return build


ENTRIES = (
    Entry("sac", SECTION, SACConfig, _build("sac"), heterogeneous=True),
    Entry("rlpd", SECTION, SACConfig, _build("rlpd"), heterogeneous=True, defaults={"learner": {"mix": RLPD_MIX}}),
)
"""Plain SAC first: :func:`embodyrl.algos.registry.as_algorithm` takes a bare config's first entry."""
