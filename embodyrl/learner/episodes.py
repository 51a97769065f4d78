"""Episode returns and intervention rates from the step stream, for a learner's progress lines.

Batches of one episode arrive one after another (an episode spans many
batches, a batch may end one episode and start the next); the sums of each
open (actor, device, episode) are kept until its final row arrives: its
return, and how many of its acted rows a person overrode (``source`` =
INTERVENTION) out of those the actor acted (online or intervention;
demonstration rows are no one's online episode).
"""

from __future__ import annotations

import numpy as np

from ..hal.steps import Source


class EpisodeReturns:
    def __init__(self):
        self._open: dict[tuple[int, int, int], tuple[float, int, int]] = {}  # (return, acted, overridden)
        self._finished: list[tuple[int, float]] = []  # (device id, return)
        self._rates: list[float] = []

    def add(self, steps) -> int:
        """Take a batch; how many episodes it finished."""
        finished = 0
        acted = ~steps.final & (steps.source != Source.DEMONSTRATION)
        overridden = acted & (steps.source == Source.INTERVENTION)
        first, last = int(steps.episode_id[0]), int(steps.episode_id[-1])
        if first == last and not steps.final[:-1].any():  # the common batch: the middle of one episode
            return self._one_episode(steps, first, acted, overridden)
        for episode in np.unique(steps.episode_id):
            rows = steps.episode_id == episode
            key = (int(steps.actor_id[0]), int(steps.device_id[0]), int(episode))
            total, n, k = self._open.pop(key, (0.0, 0, 0))
            total += float(steps.reward[rows & ~steps.final].sum())
            n += int(np.count_nonzero(rows & acted))
            k += int(np.count_nonzero(rows & overridden))
            if steps.final[rows].any():
                finished += 1
                self._finished.append((key[1], total))
                if n:
                    self._rates.append(k / n)
            else:
                self._open[key] = (total, n, k)
        return finished

    def _one_episode(self, steps, episode: int, acted, overridden) -> int:
        """:meth:`add` for a batch of one episode, ended by its last row or not. Episode ids are
        random and never reused, so the first and last rows' ids being equal with no final row
        before the last makes every row that episode's (a final row closes an episode for good)."""
        key = (int(steps.actor_id[0]), int(steps.device_id[0]), episode)
        total, n, k = self._open.pop(key, (0.0, 0, 0))
        ends = bool(steps.final[-1])
        total += float(steps.reward[:-1].sum() if ends else steps.reward.sum())
        n += int(np.count_nonzero(acted))
        k += int(np.count_nonzero(overridden))
        if not ends:
            self._open[key] = (total, n, k)
            return 0
        self._finished.append((key[1], total))
        if n:
            self._rates.append(k / n)
        return 1

    def add_finished(self, by_device: list[tuple[int, float]], rates: list[float]) -> None:
        """Episodes another process finished (an ingest worker's): (device id, return), intervention rates."""
        self._finished.extend(by_device)
        self._rates.extend(rates)

    def take_finished(self) -> list[float]:
        """The returns of the episodes finished since the last call."""
        return [total for _, total in self.take_finished_by_device()]

    def take_finished_by_device(self) -> list[tuple[int, float]]:
        """(device id, return) of the episodes finished since the last call."""
        finished, self._finished = self._finished, []
        return finished

    def take_intervention_rates(self) -> list[float]:
        """Steps overridden / steps acted, of each episode finished since the last call."""
        rates, self._rates = self._rates, []
        return rates
