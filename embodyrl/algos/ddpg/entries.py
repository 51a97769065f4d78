"""DDPG's registry entries (``ddpg``, ``td3``): plain data; the algorithm is imported when built."""

from __future__ import annotations

from ..interface import Entry
from .config import SECTION, DDPGConfig, td3


def _build(name: str):
    def build(config: DDPGConfig):
        from .algorithm import DDPG

        return DDPG(name, td3(config) if name == "td3" else config)

    return build


ENTRIES = (
    Entry("ddpg", SECTION, DDPGConfig, _build("ddpg"), heterogeneous=True),
    Entry("td3", SECTION, DDPGConfig, _build("td3"), heterogeneous=True),
)
"""Plain DDPG first: :func:`embodyrl.algos.registry.as_algorithm` takes a bare config's first entry."""
