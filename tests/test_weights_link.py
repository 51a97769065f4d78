"""Weights reach an actor over real sockets as full tensors, deltas or quantised, bit-exactly when lossless."""

import time

import numpy as np
import pytest

from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import PolicyVersion
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire import weights as W
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.transport import LearnerServer
from embodyrl.transport.publisher import WeightsConfig

DEVICE = P.DeviceInfo(0, "d", DictSpec.of(ArraySpec("x", (1,), np.float32)),
                      ArraySpec("action", (1,), np.float32, -1, 1))


def big_tree(rng):
    return {"actor/w": rng.normal(size=(512, 512)).astype(np.float32), "actor/b": np.zeros(512, np.float32)}


def sparse_step(tree, rng, fraction=0.01):
    out = {k: v.copy() for k, v in tree.items()}
    flat = out["actor/w"].reshape(-1)
    idx = rng.choice(flat.size, int(fraction * flat.size), replace=False)
    flat[idx] += 1e-3
    return out


def exchange(server, link, version, seconds=5.0):
    """Pump both ends until the link has rebuilt ``version``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        server.poll(5)
        link.poll(5)
        got = link.take_weights()
        if got is not None and got[0] == version:
            return got[1]
    raise AssertionError(f"{version} never arrived")


@pytest.fixture
def pair(request):
    config = getattr(request, "param", WeightsConfig())
    server = LearnerServer(run_id="r", incarnation=7, weights=config)
    link = LearnerLink(server.endpoint, actor_name="a", actor_id=0, devices=[DEVICE],
                       handshake_timeout_s=5, heartbeat_s=0.01)
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=lambda: [server.poll(5) for _ in iter(stop.is_set, True)], daemon=True)
    thread.start()
    link.connect()
    stop.set()
    thread.join()
    yield server, link
    link.close()
    server.close()


def test_sparse_updates_travel_as_deltas_and_rebuild_bit_exactly(pair):
    server, link = pair
    rng = np.random.default_rng(0)
    tree = big_tree(rng)
    server.publish(PolicyVersion(7, 1), tree)
    got = exchange(server, link, PolicyVersion(7, 1))
    assert W.checksum(got) == W.checksum(tree)
    for count in range(2, 6):
        tree = sparse_step(tree, rng)
        server.publish(PolicyVersion(7, count), tree)
        got = exchange(server, link, PolicyVersion(7, count))
        for k in tree:
            assert got[k].tobytes() == tree[k].tobytes()
    assert server.publisher.sent == {"full": 1, "delta": 4}
    session = next(iter(server.sessions.values()))
    assert session.follower.downlink_bps is not None and session.follower.downlink_bps > 0


def test_dense_updates_travel_full(pair):
    server, link = pair
    rng = np.random.default_rng(1)
    for count in range(1, 4):
        tree = big_tree(rng)  # every element changes
        server.publish(PolicyVersion(7, count), tree)
        got = exchange(server, link, PolicyVersion(7, count))
        assert W.checksum(got) == W.checksum(tree)
    assert server.publisher.sent == {"full": 3}


def test_a_new_incarnation_sends_full_weights_first(pair):
    server, link = pair
    rng = np.random.default_rng(2)
    tree = big_tree(rng)
    server.publish(PolicyVersion(7, 1), tree)
    exchange(server, link, PolicyVersion(7, 1))
    tree = sparse_step(tree, rng)
    server.publish(PolicyVersion(8, 1), tree)  # the learner restarted
    got = exchange(server, link, PolicyVersion(8, 1))
    assert W.checksum(got) == W.checksum(tree)
    assert server.publisher.sent == {"full": 2}


def test_a_broken_delta_is_refused_and_full_weights_follow(pair):
    server, link = pair
    rng = np.random.default_rng(3)
    tree = big_tree(rng)
    server.publish(PolicyVersion(7, 1), tree)
    exchange(server, link, PolicyVersion(7, 1))
    bad = link._base[1]["actor/b"].copy()  # received arrays are read-only: swap in a bad copy
    bad[0] = 42.0
    link._base[1]["actor/b"] = bad  # the actor's copy went bad
    tree = sparse_step(tree, rng)
    server.publish(PolicyVersion(7, 2), tree)
    got = exchange(server, link, PolicyVersion(7, 2), seconds=15)
    assert W.checksum(got) == W.checksum(tree)
    assert link.stats.rejected.get("weights") == 1
    assert server.publisher.sent == {"full": 2, "delta": 1}


@pytest.mark.parametrize("pair", [WeightsConfig(encoding="bf16"), WeightsConfig(encoding="int8")], indirect=True)
def test_pinned_quantised_weights_arrive_close(pair):
    server, link = pair
    tree = big_tree(np.random.default_rng(4))
    server.publish(PolicyVersion(7, 1), tree)
    got = exchange(server, link, PolicyVersion(7, 1))
    assert got["actor/w"].dtype == np.float32
    np.testing.assert_allclose(got["actor/w"], tree["actor/w"], atol=0.01 * np.abs(tree["actor/w"]).max())
    assert set(server.publisher.sent) == {server.publisher.config.encoding}
