"""The operator console's API against a real console process and real actor loops: each action,
an action to an actor that cannot be reached, the token, the refusals."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("PIL")

from console_helpers import ConsoleProcess, ThreadActor, wait_for  # noqa: E402

from tests.cli_helpers import in_process  # noqa: E402


def request(url: str, body: dict | None = None, headers: dict | None = None, token: str | None = None):
    """(status, decoded JSON or bytes) of a GET, or a POST of ``body`` as JSON."""
    if token is not None:
        url += ("&" if "?" in url else "?") + f"token={token}"
    data = None if body is None else json.dumps(body).encode()
    headers = {**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=10) as answer:
            status, payload, kind = answer.status, answer.read(), answer.headers.get("content-type", "")
    except urllib.error.HTTPError as err:
        status, payload, kind = err.code, err.read(), err.headers.get("content-type", "")
    return status, (json.loads(payload) if kind.startswith("application/json") else payload)


def act(console, action, actor=None, device=None, value=None):
    status, answer = request(f"{console.url}/api/action",
                             {"action": action, "actor": actor, "device": device, "value": value}, token=console.token)
    assert status == 200, answer
    return answer


def state(console) -> dict:
    status, answer = request(f"{console.url}/api/state", token=console.token)
    assert status == 200
    return answer



def device_view(console, actor, device=0):
    for a in state(console)["actors"]:
        if a["actor_id"] == actor:
            return next(d for d in a["devices"] if d["device_id"] == device)
    return None


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("console-run")
    with ConsoleProcess(run_dir) as console, \
            ThreadActor(console.control, 0, teleop=True) as teleop_actor, \
            ThreadActor(console.control, 1, operator=True) as reset_actor:
        wait_for(lambda: len([a for a in state(console)["actors"] if a["connected"]]) == 2, what="two actors")
        yield console, teleop_actor, reset_actor, run_dir


def test_the_state_shows_each_actor_and_its_numbers_move(live):
    console, *_ = live
    first = state(console)["actors"][0]["env_steps"] or 0
    wait_for(lambda: (state(console)["actors"][0]["env_steps"] or 0) > first + 20, what="env steps to grow")
    actor, waiting = state(console)["actors"]
    assert actor["devices"][0]["name"] == "toy-0" and actor["teleop"] is True
    assert waiting["teleop"] is False and waiting["reset"] == "operator"
    assert set(actor["link"]) >= {"rtt_ms", "resends", "spool_batches", "spool_rows"}
    assert "clipped" in actor["devices"][0]["safety"]


def test_estop_latches_until_cleared(live):
    console, actor, _, _ = live
    answer = act(console, "estop", 0, 0)
    assert answer["status"] == "ok", answer
    assert actor.device.estopped and actor.device.inner.estopped_at
    steps = actor.loop.stats.env_steps
    time.sleep(0.3)
    assert actor.loop.stats.env_steps == steps, "an e-stopped device was stepped"
    assert wait_for(lambda: device_view(console, 0)["estopped"], what="the e-stop in the state")
    assert act(console, "clear_estop", 0, 0)["status"] == "ok"
    assert not actor.device.estopped
    wait_for(lambda: actor.loop.stats.env_steps > steps, what="acting again")


def test_estop_all_and_clear_all(live):
    console, a0, a1, _ = live
    assert act(console, "estop")["status"] == "ok"
    assert a0.device.estopped and a1.device.estopped
    assert act(console, "clear_estop")["status"] == "ok"
    assert not a0.device.estopped and not a1.device.estopped


def test_pause_holds_the_device_and_resume_acts_again(live):
    console, actor, _, _ = live
    assert act(console, "pause", 0, 0)["status"] == "ok"
    held = actor.loop.stats.console_held_steps
    steps = actor.loop.stats.env_steps
    wait_for(lambda: actor.loop.stats.console_held_steps > held + 10, what="held periods")
    assert actor.loop.stats.env_steps == steps
    assert wait_for(lambda: device_view(console, 0)["paused"], what="paused in the state")
    assert act(console, "resume", 0, 0)["status"] == "ok"
    wait_for(lambda: actor.loop.stats.env_steps > steps, what="acting again")


def test_take_over_needs_a_teleop_source(live):
    console, actor, _, _ = live
    assert act(console, "takeover", 0, 0)["status"] == "ok"
    before = actor.loop.stats.interventions
    wait_for(lambda: actor.loop.stats.interventions > before + 5, what="the person's steps")
    assert act(console, "release", 0, 0)["status"] == "ok"
    refused = act(console, "takeover", 1, 0)
    assert refused["status"] == "failed" and "no teleop source" in refused["error"]


def test_answer_the_reset_prompt(live):
    console, _, actor, _ = live
    prompt = wait_for(lambda: device_view(console, 1)["prompt"], what="the reset prompt")
    assert "episode" in prompt["summary"]
    assert act(console, "answer", 1, 0, "success")["status"] == "ok"
    wait_for(lambda: actor.loop.stats.labels.get("success"), what="the label")
    refused = act(console, "answer", 0, 0, "go")
    assert refused["status"] == "failed" and "actor.reset is auto" in refused["error"]


def test_camera_frames_arrive_at_the_picked_size(live):
    console, *_ = live
    assert act(console, "stream", 0, None, {"fps": 10, "width": 80})["status"] == "ok"
    frames = wait_for(lambda: device_view(console, 0)["frames"].get("camera/front"), what="a frame")
    status, jpeg = request(f"{console.url}/frame?actor=0&device=0&field=camera/front", token=console.token)
    assert status == 200 and jpeg[:2] == b"\xff\xd8"
    assert frames["width"] <= 80


def test_an_unreachable_actor_fails_visibly(live):
    console, *_ = live
    answer = act(console, "estop", 7, 0)
    assert answer["status"] == "failed" and "actor 7 has never connected" in answer["error"]
    entry = wait_for(lambda: next((a for a in state(console)["actions"] if a["id"] == answer["id"]), None))
    assert entry["status"] == "failed"
    training = act(console, "pause_training")
    assert training["status"] == "failed" and "learner" in training["error"]


def test_an_actor_that_left_fails_visibly(tmp_path):
    with ConsoleProcess(tmp_path) as console:
        with ThreadActor(console.control, 3):
            wait_for(lambda: state(console)["actors"], what="the actor")
        answer = act(console, "estop", 3, 0)
        assert answer["status"] == "failed" and "actor 3" in answer["error"]


def test_bad_requests_are_refused_by_name(live):
    console, *_ = live
    token = console.token
    assert request(f"{console.url}/api/action", {"action": "explode"}, token=token)[0] == 400
    assert request(f"{console.url}/api/action", {"action": "answer", "actor": 1, "value": "maybe"}, token=token)[0] == 400
    assert request(f"{console.url}/api/action", {"action": "estop", "actor": -1}, token=token)[0] == 400
    form = urllib.request.Request(f"{console.url}/api/action?token={token}", data=b"action=estop",
                                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(form, timeout=10)
    assert refused.value.code == 415
    status, _ = request(f"{console.url}/api/action", {"action": "estop", "actor": 0, "device": 0},
                        headers={"Origin": "http://evil.example"}, token=token)
    assert status == 403


def test_every_action_is_logged_in_metrics_jsonl(live):
    console, _, _, run_dir = live
    act(console, "resume", 0, 0)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    actions = [r for r in rows if r.get("event") == "action"]
    assert actions and all({"time", "origin", "action", "target", "status"} <= set(r) for r in actions)
    assert any(r["status"] == "failed" for r in actions)


def test_off_loopback_a_token_is_required(tmp_path):
    with ConsoleProcess(tmp_path, "--insecure", bind_host="0.0.0.0") as console:
        assert console.token
        assert request(f"{console.url}/api/state")[0] == 401
        assert request(f"{console.url}/api/state", token="wrong")[0] == 401
        assert request(f"{console.url}/api/state", token=console.token)[0] == 200
        assert request(f"{console.url}/api/state", headers={"Authorization": f"Bearer {console.token}"})[0] == 200


def test_plain_http_off_loopback_is_refused(tmp_path):
    done = in_process("console", tmp_path, "--bind", "0.0.0.0:8799")
    assert done.returncode == 2
    assert "refusing plain HTTP on 0.0.0.0:8799" in done.stderr and "--insecure" in done.stderr


def test_a_hostile_peer_costs_nothing_and_claims_nothing(tmp_path):
    import msgpack
    import zmq

    from embodyrl.hal.wire import control
    from embodyrl.hal.wire.codec import encode

    with ConsoleProcess(tmp_path) as console:
        context = zmq.Context()
        peer = context.socket(zmq.DEALER)
        peer.setsockopt(zmq.LINGER, 0)
        peer.connect(console.control)
        garbage = [[b"\x00\xff not msgpack"], [msgpack.packb({"p": 2, "k": "HELLO"})], [b"x" * (300 * 1024)],
                   encode(control.STATUS, {"status": {"env_steps": 5}}),  # no HELLO first: no session
                   encode(control.HELLO, {"protocol": 99, "role": "actor", "actor_id": 1, "devices": []}),
                   encode(control.HELLO, {"protocol": 1, "role": "root", "actor_id": 1, "devices": []})]
        for frames in garbage:
            peer.send_multipart(frames)
        assert peer.poll(5000), "a refused HELLO is answered with its reason"
        refusals = []
        while peer.poll(500):
            refusals.append(peer.recv_multipart())
        assert any(b"protocol" in frames[0] for frames in refusals)
        assert state(console)["actors"] == []
        # a peer with a session may not send frames of a camera it did not declare
        peer.send_multipart(encode(control.HELLO, {"protocol": 1, "role": "actor", "actor_id": 2, "devices": [
            {"device_id": 0, "name": "arm", "cameras": [], "teleop": False}]}))
        peer.send_multipart(encode(control.FRAME, {"device": 0, "field": "camera/x", "seq": 1, "width": 8, "height": 8},
                                   {"jpeg": np.zeros(16, np.uint8)}))
        wait_for(lambda: state(console)["actors"], what="the HELLO")
        assert state(console)["actors"][0]["devices"][0]["frames"] == {}
        assert console.process.poll() is None
        context.destroy(linger=0)


def test_curvezmq_admits_only_the_run_keys(tmp_path):
    from embodyrl.cli.security import console_key_pairs
    from embodyrl.hal.console import ConsoleLink
    from embodyrl.hal.wire.security import ClientKeys, generate_keys

    server = console_key_pairs(tmp_path / "keys")
    console_public = server.secret_key_file.with_suffix(".key")
    actor_keys = ClientKeys(tmp_path / "keys" / "actor" / "actor.key_secret", console_public)
    _, stranger_secret = generate_keys(tmp_path / "stranger", "stranger")
    with ConsoleProcess(tmp_path, "--curve") as console:
        with ConsoleLink(console.control, role="actor", actor_id=4,
                         keys=ClientKeys(stranger_secret, console_public)).start([]) as stranger:
            time.sleep(3)
            assert not stranger.connected and state(console)["actors"] == []
        with ConsoleLink(console.control, role="actor", actor_id=5, keys=actor_keys).start([]) as admitted:
            wait_for(lambda: admitted.connected, what="the handshake")
            assert [(a["actor_id"], a["peer"]) for a in state(console)["actors"]] == [(5, "key 'actor'")]
            # the key is bound to its first id, and may not be the learner
            for role, actor_id in (("actor", 6), ("learner", 0)):
                with ConsoleLink(console.control, role=role, actor_id=actor_id, keys=actor_keys).start([]) as other:
                    refused = wait_for(lambda: other.refused, what=f"the refusal of {role} {actor_id}")  # noqa: B023
                    assert "key 'actor'" in refused, refused
        learner_keys = ClientKeys(tmp_path / "keys" / "learner" / "learner.key_secret", console_public)
        with ConsoleLink(console.control, role="learner", keys=learner_keys).start([]) as learner:
            wait_for(lambda: (state(console)["learner"] or {}).get("connected"), what="the learner")
            assert state(console)["learner"]["peer"] == "key 'learner'" and not learner.refused


def test_https_off_loopback_needs_no_insecure(tmp_path):
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("openssl makes the test's certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    with ConsoleProcess(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), bind_host="0.0.0.0") as console:
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        url = console.url.replace("http://", "https://")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/state", context=context, timeout=10)
        assert refused.value.code == 401
        with urllib.request.urlopen(f"{url}/api/state?token={console.token}", context=context, timeout=10) as answer:
            assert json.loads(answer.read())["t"] == "state"


def test_a_finished_run_is_shown_from_its_metrics(tmp_path):
    rows = [{"time": 1.0, "env_steps": 100, "episode_return": -5.0, "intervention_rate": 0.5, "critic_loss": 2.0,
             "updates": 10, "policy_version": 2, "replay_size": 100},
            {"source": "console", "time": 2.0, "env_steps": 100, "success_rate": 0.25},
            {"source": "console", "event": "action", "id": "a1", "time": 3.0, "origin": "browser 127.0.0.1",
             "action": "estop", "target": "actor 0 device 0", "status": "ok", "error": "", "ms": 4.0, "applied_ms": 2.0},
            {"time": 4.0, "env_steps": 200, "episode_return": -3.0, "intervention_rate": 0.25, "critic_loss": 1.0,
             "updates": 20, "policy_version": 4, "replay_size": 200, "policy_age": 37.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"time": 5, "env_')
    with ConsoleProcess(tmp_path) as console:
        shown = state(console)
    assert shown["finished"] and shown["learner"]["env_steps"] == 200 and not shown["learner"]["connected"]
    assert shown["learner"]["policy_age"] == 37.5  # gradient steps behind: what the async path costs
    assert shown["curves"]["env_steps"] == [100, 200]
    assert shown["curves"]["success_rate"] == [0.25, None]
    assert shown["curves"]["episode_return"] == [-5.0, -3.0]
    assert shown["losses"]["critic_loss"] == [2.0, 1.0]
    assert [a["action"] for a in shown["actions"]] == ["estop"]


def test_the_console_guide_names_every_action_the_api_takes():
    from pathlib import Path

    from embodyrl.hal.wire.control import ACTIONS

    guide = (Path(__file__).resolve().parents[1] / "docs" / "console.md").read_text()
    assert [action for action in ACTIONS if f"`{action}`" not in guide] == []


def test_a_learner_no_longer_heard_is_finished_or_gone_never_still_running(tmp_path, monkeypatch):
    from embodyrl.console import state as console_state

    state = console_state.ConsoleState(tmp_path)
    learner = state.hello(b"learner", "learner", -1, [])
    state.status(learner, {"training": "running", "env_steps": 400, "budget": 1000})
    assert state.snapshot()["learner"]["training"] == "running"
    learner.last_seen -= 2 * console_state.CONNECTED_WITHIN_S  # silent: crashed, or restarting
    assert state.snapshot()["learner"]["training"] == "gone"
    state.status(learner, {"training": "running", "env_steps": 1000, "budget": 1000})
    learner.last_seen -= 2 * console_state.CONNECTED_WITHIN_S  # silent after its budget: done
    view = state.snapshot()
    assert view["learner"]["training"] == "finished" and not view["learner"]["connected"]
