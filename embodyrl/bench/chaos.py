"""``embodyrl bench chaos``: break the system on purpose and count what was lost.

Scenarios, in order: actor killed and restarted, learner side killed and
restarted (the link with a durable learner side), the real JAX learner
SIGKILLed and resumed while real ``embodyrl actor`` processes reconnect by
themselves (one of them killed too), network partition (a proxy drops every connection), hostile
traffic beside an honest actor, slow learner (backpressure, memory), disk
full under the replay (a small tmpfs; skipped with the reason when it cannot
be mounted), bad config and bad device data. Each reports ``name``,
``injected`` (faults), ``produced``, ``stored``, ``lost``, ``duplicated`` and
``recovery_s`` (median seconds from the fault's end until every row produced
before it was stored), plus what it measured. ``--quick`` makes each small.
``EMBODYRL_CHAOS_SOAK_S=3600`` adds a soak of that many seconds with the
real processes, one SIGKILL a minute (not for CI).

The baseline is built in: the hostile scenario measures the honest actor's
throughput unattacked and attacked in the same run and reports the ratio; the
slow learner compares the actor's memory in the first and second half.
"""

from __future__ import annotations

import os

from . import chaos_faults, chaos_link, chaos_process

SCENARIOS = (chaos_link.actor_kill, chaos_link.learner_kill, chaos_process.learner_sigkill, chaos_link.partition,
             chaos_link.hostile, chaos_link.slow_learner, chaos_faults.disk_full, chaos_faults.bad_input)


def run(quick: bool = False, only: tuple[str, ...] | None = None) -> dict:
    """Run every scenario (or those whose function name is in ``only``); one record each."""
    scenarios = []
    for scenario in SCENARIOS:
        if only is None or scenario.__name__ in only:
            scenarios.append(scenario(quick))
    soak_s = float(os.environ.get("EMBODYRL_CHAOS_SOAK_S", "0"))
    if soak_s > 0 and (only is None or "soak" in only):
        scenarios.append(chaos_process.soak(soak_s))
    return {"quick": quick, "scenarios": scenarios,
            "lost": sum(s["lost"] for s in scenarios), "duplicated": sum(s["duplicated"] for s in scenarios)}
