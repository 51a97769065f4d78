"""Who may speak as which peer at the console's control endpoint, with real sockets: a real console
process, honest peers on the real console link, impostors on raw DEALER sockets. An operator's
command reaches only the peer that owns its id, and only that peer's DONE answers it."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("PIL")

from console_helpers import ConsoleProcess, ThreadActor, wait_for  # noqa: E402

from embodyrl.console.process import LinkPeer, RawPeer  # noqa: E402


def act(console, action, actor=None, device=None) -> dict:
    status, answer = console.request("/api/action", {"action": action, "actor": actor, "device": device})
    assert status == 200, answer
    return answer


def actors(console) -> dict[int, dict]:
    return {a["actor_id"]: a for a in console.request("/api/state")[1]["actors"]}



def test_an_impostor_actor_is_refused_by_name_and_the_estop_reaches_the_owner(tmp_path):
    with ConsoleProcess(tmp_path) as console, ThreadActor(console.control, 0) as honest:
        wait_for(lambda: actors(console).get(0, {}).get("connected"), what="the honest actor")
        stops = len(honest.device.inner.estopped_at)
        with RawPeer(console.control, "actor", 0) as impostor:
            wait_for(lambda: impostor.refusals or impostor.welcomes, what="an answer to the impostor's HELLO")
            outcomes = []
            for _ in range(5):
                outcomes.append(act(console, "estop", 0, 0)["status"])
                outcomes.append(act(console, "clear_estop", 0, 0)["status"])
        reached = len(honest.device.inner.estopped_at) - stops
        assert impostor.commands == [], f"{len(impostor.commands)} commands reached the impostor"
        assert reached == 5 and outcomes == ["ok"] * 10, (reached, outcomes)
        assert impostor.welcomes == 0 and impostor.refusals
        assert "actor 0" in impostor.refusals[0] and "connection" in impostor.refusals[0], impostor.refusals[0]
        assert actors(console)[0]["peer"].startswith("connection "), "the page names the owner's connection"


def test_an_impostor_learner_is_refused_and_pause_training_reaches_the_learner(tmp_path):
    with ConsoleProcess(tmp_path) as console, LinkPeer(console.control, "learner") as learner:
        wait_for(lambda: (console.request("/api/state")[1]["learner"] or {}).get("connected"), what="the learner")
        with RawPeer(console.control, "learner") as impostor:
            wait_for(lambda: impostor.refusals or impostor.welcomes, what="an answer to the impostor's HELLO")
            outcomes = [act(console, action)["status"] for action in ("pause_training", "resume_training") * 2]
        assert impostor.commands == [] and impostor.welcomes == 0, impostor.commands
        assert learner.commands == ["pause_training", "resume_training"] * 2 and outcomes == ["ok"] * 4
        assert "learner" in impostor.refusals[0], impostor.refusals[0]


def test_a_done_counts_only_from_the_peer_the_command_was_sent_to(tmp_path):
    forged = tuple(f"a{n}.0" for n in range(1, 40))  # the console's command ids are guessable
    with ConsoleProcess(tmp_path) as console, \
            RawPeer(console.control, "actor", 5, answer=False, hello_every_s=1.0) as silent, \
            RawPeer(console.control, "actor", 6, hello_every_s=1.0, forge=forged):
        wait_for(lambda: {5, 6} <= set(actors(console)), what="both sessions")
        answer = act(console, "estop", 5, 0)
        assert len(silent.commands) == 1, "the command went to the peer that owns actor 5"
        assert answer["status"] == "failed" and "no answer from actor 5" in answer["error"], answer


def test_a_restarted_actor_waits_out_its_predecessor_then_takes_its_id(tmp_path):
    with ConsoleProcess(tmp_path) as console:
        first = LinkPeer(console.control, "actor", 3).__enter__()
        try:
            wait_for(lambda: actors(console).get(3, {}).get("connected"), what="the first actor 3")
            first_peer = actors(console)[3].get("peer")
            with LinkPeer(console.control, "actor", 3) as second:
                refused = wait_for(lambda: second.link.refused, timeout=6, what="the second claimant's refusal")
                assert "actor 3" in refused, refused
                first.__exit__()  # the first is gone: the second, retrying, takes actor 3 over
                wait_for(lambda: actors(console)[3]["peer"] != first_peer and not second.link.refused, timeout=5,
                         what="the restarted actor to take its id")
                assert act(console, "estop", 3, 0)["status"] == "ok"
                assert second.commands == ["estop"] and first.commands == []
        finally:
            first.__exit__()
