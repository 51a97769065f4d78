"""Episode returns from the step stream, for a learner's progress lines.

Batches of one episode arrive one after another (an episode spans many
batches, a batch may end one episode and start the next); the sum of each
open (actor, device, episode) is kept until its final row arrives.
"""

from __future__ import annotations

import numpy as np


class EpisodeReturns:
    def __init__(self):
        self._open: dict[tuple[int, int, int], float] = {}
        self._finished: list[tuple[int, float]] = []  # (device id, return)

    def add(self, steps) -> int:
        """Take a batch; how many episodes it finished."""
        finished = 0
        for episode in np.unique(steps.episode_id):
            rows = steps.episode_id == episode
            key = (int(steps.actor_id[0]), int(steps.device_id[0]), int(episode))
            total = self._open.pop(key, 0.0) + float(steps.reward[rows & ~steps.final].sum())
            if steps.final[rows].any():
                finished += 1
                self._finished.append((key[1], total))
            else:
                self._open[key] = total
        return finished

    def take_finished(self) -> list[float]:
        """The returns of the episodes finished since the last call."""
        return [total for _, total in self.take_finished_by_device()]

    def take_finished_by_device(self) -> list[tuple[int, float]]:
        """(device id, return) of the episodes finished since the last call."""
        finished, self._finished = self._finished, []
        return finished
