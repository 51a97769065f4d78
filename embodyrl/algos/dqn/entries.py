"""DQN's registry entry: plain data; the algorithm is imported when built."""

from __future__ import annotations

from ..interface import Entry
from .config import DQNConfig


def _build(config: DQNConfig):
    from .algorithm import DQN

    return DQN("dqn", config)


ENTRIES = (Entry("dqn", "dqn", DQNConfig, _build),)
