"""The robot server's rate limits never lock out its own session: a restarted actor gets back in
while others flood, with keys (the owner's key has its own bucket) and without (HELLO's reserve)."""

from __future__ import annotations

import time

import test_robot_server_hardening as hardening
from test_robot_server_hardening import Raw

from embodyrl.bench import chaos_robot
from embodyrl.hal.drivers.remote import RemoteDevice
from embodyrl.hal.wire.codec import encode
from embodyrl.hal.wire.security import RateLimiter, RateLimits

serve, keyring = hardening.serve, hardening.keyring  # its fixtures, shared


def test_a_restarted_actor_gets_its_session_back_within_a_second_while_three_processes_flood():
    result = chaos_robot.reconnect_under_flood(flooders=3, watchdog_s=0.2, deadline_s=3.0)
    seconds = result["restarted_actor_reconnect_s_under_flood"]
    assert seconds is not None, f"locked out for {result['deadline_s']} s: {result}"
    assert seconds < 1.0, result
    assert result["flood_messages_per_s"] > 1000 and result["rate_limited"] > 1000, result


def test_the_owners_key_resumes_while_other_keys_have_spent_the_shared_bucket(serve, keyring):
    limits = RateLimits(per_key_per_s=5, per_key_burst=5, global_per_s=0.5, global_burst=2)
    server = serve(watchdog_s=0.2, keys=keyring.server, rate_limits=limits)
    actor = RemoteDevice(server.endpoint, keys=keyring.client("actor"), timeout_s=2.0, retries=0)
    actor.connect()
    actor.reset(seed=0)
    actor._drop_socket()  # dies without BYE
    peers = [Raw(server.endpoint, keyring.client(name)) for name in ("intruder", "monitor")]
    try:
        for peer in peers:
            for _ in range(10):
                peer.send("STATUS")
        time.sleep(0.2)  # the shared bucket is spent; it takes 2 s to hold a token again
        start = time.monotonic()
        with RemoteDevice(server.endpoint, keys=keyring.client("actor"), timeout_s=1.0, retries=0) as restarted:
            resumed_s = time.monotonic() - start
            restarted.reset(seed=0)
            status = restarted.server_status()
    finally:
        for peer in peers:
            peer.close()
    assert resumed_s < 0.5 and status["resumed"] == 1 and status["rate_limited"] >= 10


def test_a_status_flood_leaves_hellos_reserve_and_each_peer_spends_its_own_bucket_first():
    limits = RateLimits(per_key_per_s=1, per_key_burst=3, global_per_s=1, global_burst=10, hello_per_s=1,
                        hello_burst=2)
    limiter, now = RateLimiter(limits, 0.0), 0.0
    admitted = [limiter.allow(b"flooder-%d" % (i % 8), now) for i in range(100)]  # STATUS from 8 connections
    assert sum(bool(a) for a in admitted) == 10  # the shared bucket's burst
    assert limiter.allow(b"flooder-9", now) is None
    assert limiter.allow(b"restarted", now, hello=True) == "hello"  # the reserve was untouched
    assert [limiter.allow(b"hello-flooder", now, hello=True) for _ in range(4)] == ["hello", None, None, None]
    assert limiter.allow("owner-key", now, owner=True) == "owner"  # the owner's key: its own bucket only
    assert limiter.allow(b"flooder-0", now + 100) == "global"  # buckets refill


def test_a_message_let_in_as_a_hello_that_is_not_one_is_dropped(serve):
    limits = RateLimits(per_key_per_s=5, per_key_burst=5, global_per_s=0.5, global_burst=1)
    server = serve(rate_limits=limits)
    spender, disguised = Raw(server.endpoint), Raw(server.endpoint)
    try:
        assert spender.ask("STATUS") is not None  # the shared bucket is spent
        disguised.sock.send_multipart(encode("STATUS", {"seq": 1, "k": "HELLO"}))  # HELLO's bytes, not a HELLO
        assert disguised.receive(0.5) is None
        assert disguised.ask("HELLO").kind == "SPECS"  # a real one is let in
    finally:
        spender.close()
        disguised.close()
