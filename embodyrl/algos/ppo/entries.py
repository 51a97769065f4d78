"""PPO's registry entry: plain data; the algorithm is imported when built."""

from __future__ import annotations

from ..interface import Entry
from .config import PPOConfig


def _build(config: PPOConfig):
    from .algorithm import PPO

    return PPO("ppo", config)


ENTRIES = (
    Entry("ppo", "ppo", PPOConfig, _build, shard_by="rollouts_per_iteration",
          # no random warm-up (rows acted without the learner's weights are discarded) and no row
          # beyond the credit (a synchronous learner grants exactly one iteration's rows)
          defaults={"actor": {"random_steps": 0, "act_within_credit": True}}),
)
