"""Where the learner loop's thread spends its CPU on the intake, by stage: what ``bench transport``
and ``bench scale`` report as each stage's share (the writer, commit and ZeroMQ threads are the
rest of the process's CPU)."""

from __future__ import annotations

import time

STAGES = ("receive_and_check", "store", "commit", "acks_and_credits", "upkeep")
"""``receive_and_check``: the socket, the header, the arrays' views, the batch's checks;
``store``: counters, episode sums and the replay's append (rows packed, written or queued);
``commit``: the loop thread's part of a group commit (the index; the sync is the commit thread's);
``acks_and_credits``: one ACK per session for what a commit made durable, and credit grants;
``upkeep``: heartbeats, logs, the console."""


class StageClock:
    """Thread CPU seconds by stage, one ``thread_time`` call a lap (a poll makes five)."""

    def __init__(self):
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self._last = 0.0

    def start(self) -> None:
        self._last = time.thread_time()

    def lap(self, stage: str) -> None:
        now = time.thread_time()
        self.seconds[stage] += now - self._last
        self._last = now

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)


def shares(before: dict[str, float], after: dict[str, float], process_cpu_s: float) -> dict[str, float]:
    """Each stage's share of the process's CPU between two snapshots, and ``other_threads`` (what the
    loop thread did not spend on a stage: the writer, commit and ZeroMQ threads, and any training)."""
    spent = {stage: after[stage] - before[stage] for stage in STAGES}
    out = {stage: round(s / process_cpu_s, 3) for stage, s in spent.items()} if process_cpu_s > 0 else {}
    if out:
        out["other_threads"] = round(1 - sum(spent.values()) / process_cpu_s, 3)
    return out
