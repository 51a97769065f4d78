"""Chaos at the operator console: impostors claim a live actor's id and the learner's place while
the operator sends e-stops and pauses training.

A real ``embodyrl console`` process; an honest actor and an honest learner
on the real console link (:class:`~embodyrl.console.process.LinkPeer`);
two raw DEALER impostors (:class:`~embodyrl.console.process.RawPeer`) that
say HELLO as actor 0 and as the learner ten times a second and answer every
COMMAND they get with DONE ok. The operator, over the HTTP API with the
token, sends e-stop and clear to actor 0, and pause and resume to the
learner. ``console_commands_misrouted`` counts the COMMANDs that reached
anyone but the owner of the id (goal 0); ``lost`` the operator's commands
that did not reach their owner.
"""

from __future__ import annotations

import tempfile
import time


def _wait(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"console_impostor: timed out waiting for {what}")
        time.sleep(0.05)


def console_impostor(quick: bool = False) -> dict:
    """The scenario; one record (see the module docstring)."""
    from ..console.process import ConsoleProcess, LinkPeer, RawPeer

    rounds = 5 if quick else 25
    with tempfile.TemporaryDirectory() as run_dir, ConsoleProcess(run_dir) as console, \
            LinkPeer(console.control, "actor", 0) as actor, LinkPeer(console.control, "learner") as learner:
        def live() -> bool:
            shown = console.request("/api/state")[1]
            return bool(shown["actors"] and shown["actors"][0]["connected"] and (shown["learner"] or {}).get("connected"))

        _wait(live, 30, "the honest actor and learner")
        with RawPeer(console.control, "actor", 0, hello_every_s=0.1) as fake_actor, \
                RawPeer(console.control, "learner", hello_every_s=0.1) as fake_learner:
            _wait(lambda: all(fake.refusals or fake.welcomes for fake in (fake_actor, fake_learner)), 10,
                  "the impostors' first answers")
            started = time.monotonic()
            sent, failed = [], 0
            for _ in range(rounds):
                for body in ({"action": "estop", "actor": 0, "device": 0}, {"action": "clear_estop", "actor": 0},
                             {"action": "pause_training"}, {"action": "resume_training"}):
                    status, answer = console.request("/api/action", body)
                    sent.append(body["action"])
                    failed += status != 200 or answer.get("status") != "ok"
            seconds = time.monotonic() - started
        reached = actor.commands + learner.commands
    misrouted = len(fake_actor.commands) + len(fake_learner.commands)
    lost = sum(max(0, sent.count(a) - reached.count(a)) for a in set(sent))
    return {"name": "console_impostor", "injected": fake_actor.hellos + fake_learner.hellos,
            "produced": len(sent), "stored": len(sent) - lost, "lost": lost,
            "duplicated": max(0, len(reached) - len(sent)), "recovery_s": 0.0,
            "console_commands_misrouted": misrouted, "operator_actions_failed": failed,
            "impostor_refusals": len(fake_actor.refusals) + len(fake_learner.refusals),
            "impostor_welcomes": fake_actor.welcomes + fake_learner.welcomes,
            "actions_per_s": round(len(sent) / seconds, 1) if seconds > 0 else None}
