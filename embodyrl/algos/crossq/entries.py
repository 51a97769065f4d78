"""CrossQ's registry entry: plain data; the algorithm is imported when built."""

from __future__ import annotations

from ..interface import Entry
from .config import SECTION, CrossQConfig


def _build(config: CrossQConfig):
    from .algorithm import CrossQ

    return CrossQ("crossq", config)


ENTRIES = (Entry("crossq", SECTION, CrossQConfig, _build),)
