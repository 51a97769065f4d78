"""``embodyrl bench chaos``: break the system on purpose and count what was lost.

Scenarios, in order: actor killed and restarted, learner side crashed and
restarted on its persistent replay, the real JAX learner SIGKILLed and
resumed while real ``embodyrl actor`` processes reconnect by themselves (one
of them killed too), network partition (a proxy drops every connection),
attackers in their own processes beside an honest actor, slow learner
(backpressure, memory), disk full under the replay (a small tmpfs; skipped
with the reason when it cannot be mounted), bad config and bad data injected
into a running learner server and a running robot server, and the robot
server's watchdog while its socket is flooded, and impostors at the operator
console claiming a live actor's id and the learner's place while the operator
sends e-stops. Each reports ``name``,
``injected`` (faults), ``produced`` (rows the actors' links took, from their
ledgers), ``stored`` (rows the replay holds), ``lost``, ``duplicated`` and
``recovery_s`` (median seconds from the fault's end until every row produced
before it was durable), plus what it measured. ``--quick`` makes each small.
``EMBODYRL_CHAOS_SOAK_S=3600`` adds a soak of that many seconds with the
real processes, one SIGKILL a minute (not for CI).

The baseline is built in: the hostile scenario measures the honest actor's
throughput and the learner's CPU unattacked and attacked in alternating
windows of the same run; the slow learner compares the actor's memory in the
first and second half. The top level of the result lifts the headline
figures: ``hostile_reject_cpu_us_median``, ``honest_ratio_under_attack``,
``bomb_rss_growth_mb``, ``robot_watchdog_delay_ms_under_flood``,
``console_commands_misrouted`` (goal 0) and
``restarted_actor_reconnect_s_under_flood`` (None for a scenario that did
not run).
"""

from __future__ import annotations

import os

from . import chaos_console, chaos_faults, chaos_link, chaos_process


def _robot_scenarios() -> tuple:
    """The robot server's scenarios, where this installation has them."""
    try:
        from . import chaos_robot
    except ImportError:
        return ()
    names = ("watchdog_under_flood", "reconnect_under_flood")
    return tuple(s for s in (getattr(chaos_robot, n, None) for n in names) if s is not None)


def _console_scenarios() -> tuple:
    """The operator console's scenario, where this installation has the console's extra."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return ()
    return (chaos_console.console_impostor,)


SCENARIOS = (chaos_link.actor_kill, chaos_link.learner_kill, chaos_process.learner_sigkill, chaos_link.partition,
             chaos_link.hostile, chaos_link.slow_learner, chaos_faults.disk_full, chaos_faults.bad_input,
             *_robot_scenarios(), *_console_scenarios())
FIGURES = ("hostile_reject_cpu_us_median", "honest_ratio_under_attack", "bomb_rss_growth_mb",
           "robot_watchdog_delay_ms_under_flood", "console_commands_misrouted",
           "restarted_actor_reconnect_s_under_flood")
"""Lifted to the top level from the scenario that measures each."""


def run(quick: bool = False, only: tuple[str, ...] | None = None) -> dict:
    """Run every scenario (or those whose function name is in ``only``); one record each."""
    scenarios = []
    for scenario in SCENARIOS:
        if only is None or scenario.__name__ in only:
            scenarios.append(scenario(quick))
    soak_s = float(os.environ.get("EMBODYRL_CHAOS_SOAK_S", "0"))
    if soak_s > 0 and (only is None or "soak" in only):
        scenarios.append(chaos_process.soak(soak_s))
    figures = {key: next((s[key] for s in scenarios if key in s), None) for key in FIGURES}
    return {"quick": quick, **figures, "scenarios": scenarios,
            "lost": sum(s["lost"] for s in scenarios), "duplicated": sum(s["duplicated"] for s in scenarios)}
