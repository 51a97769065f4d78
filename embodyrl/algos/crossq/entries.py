"""CrossQ's registry entry: plain data; the algorithm is imported when built."""

from __future__ import annotations

from ..interface import Entry
from .config import SECTION, CrossQConfig


def _build(config: CrossQConfig):
    from .algorithm import CrossQ

    return CrossQ("crossq", config)


YOUNG_POLICY = {"rate_tolerance": 256, "credit_quantum": 128, "publish_every": 16}
"""The asynchronous path's settings CrossQ runs with unless told: its actor moves fast (learning rate
1e-3, Adam's b1 0.5), and on Hopper the learner's default tolerance let the actor act with policies
up to 384 updates old, which cost it two thirds of SBX's return; a quarter of the tolerance and
weights every 16 updates bring it level at no wall-clock cost (docs/benchmarks.md, "CrossQ beside
SBX's CrossQ and SAC")."""

ENTRIES = (Entry("crossq", SECTION, CrossQConfig, _build, defaults={"learner": YOUNG_POLICY}),)
