"""Learners exchanging parameters with their neighbours over real sockets."""

import multiprocessing as mp

import numpy as np

from embodyrl.transport.peers import PeerLink


def ring(n):
    return {i: {(i - 1) % n, (i + 1) % n} for i in range(n)}


def average_on_ring(peer_id: int, n: int, endpoints, rounds: int, out) -> None:
    """One process per learner: mix x with its ring neighbours for ``rounds`` rounds."""
    link = PeerLink(peer_id, bind=endpoints[peer_id][1])
    neighbours = ring(n)[peer_id]
    link.connect({p: endpoints[p][0] for p in neighbours})
    x = np.array([float(peer_id)])
    for r in range(rounds):
        got = link.exchange(r, {"x": x}, expect=neighbours, timeout_s=20)
        assert set(got) == neighbours
        x = (x + sum(g["x"] for g in got.values())) / (1 + len(got))
    out.put((peer_id, float(x[0]), link.stats.missed))
    link.close()


def test_ring_of_learner_processes_reaches_consensus():
    import socket

    n = 4
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    endpoints = {i: (f"tcp://127.0.0.1:{p}", f"tcp://127.0.0.1:{p}") for i, p in enumerate(ports)}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=average_on_ring, args=(i, n, endpoints, 30, out)) for i in range(n)]
    for p in procs:
        p.start()
    try:
        results = dict((pid, (x, missed)) for pid, x, missed in (out.get(timeout=120) for _ in range(n)))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    values = [x for x, _ in results.values()]
    assert max(values) - min(values) < 1e-3  # spread shrank from 3
    assert abs(np.mean(values) - 1.5) < 1e-6  # mixing on a regular graph keeps the mean
    assert all(missed == 0 for _, missed in results.values())


def test_missing_neighbour_is_reported_not_waited_for():
    a, b = PeerLink(0), PeerLink(1)
    try:
        a.connect({1: b.endpoint})
        got = b.exchange(0, {"x": np.ones(2)}, expect={0}, timeout_s=0.3)  # a never sends round 0
        assert got == {} and b.stats.missed == 1
        a._round = 0
        a.exchange(1, {"x": np.zeros(2)}, expect=set(), timeout_s=0)
        got = b.exchange(1, {"x": np.ones(2)}, expect={0}, timeout_s=5)
        np.testing.assert_array_equal(got[0]["x"], np.zeros(2))
    finally:
        a.close()
        b.close()


def test_early_rounds_wait_stale_rounds_are_dropped():
    a, b = PeerLink(0), PeerLink(1)
    try:
        a.connect({1: b.endpoint})
        for r in (0, 1, 2):
            a.exchange(r, {"x": np.full(1, r)}, expect=set(), timeout_s=0)
        got = b.exchange(1, {}, expect={0}, timeout_s=5)  # round 0 arrives too, stale by then
        assert got[0]["x"][0] == 1
        got = b.exchange(2, {}, expect={0}, timeout_s=5)
        assert got[0]["x"][0] == 2
        assert b.stats.stale == 1 and b.stats.missed == 0
    finally:
        a.close()
        b.close()


def test_a_peer_round_is_judged_by_its_header_before_any_array_is_read():
    import msgpack
    import zmq

    from embodyrl.hal.wire.codec import PROTOCOL_VERSION

    b = PeerLink(1)
    rogue = zmq.Context.instance().socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(b.endpoint)

    def send(round_, shape, frame):
        header = {"p": PROTOCOL_VERSION, "k": "PEER", "f": {"sender": 0, "round": round_},
                  "a": [["x", "float32", shape, "zstd"]]}
        rogue.send_multipart([msgpack.packb(header), frame])

    try:
        b.exchange(3, {"x": np.ones(4, np.float32)}, expect=set(), timeout_s=0)  # sets the expected size
        send(2, [4], b"not zstd at all")  # a stale round: dropped on its header, never inflated
        send(5, [1 << 28], b"\0" * 64)  # a GiB declared where 16 bytes are expected
        b.exchange(4, {"x": np.ones(4, np.float32)}, expect={0}, timeout_s=1.0)
        assert b.stats.stale == 1 and "compression" not in b.stats.rejected
        assert b.stats.rejected.get("frame_size", 0) + b.stats.rejected.get("message_size", 0) == 1
    finally:
        rogue.close(0)
        b.close()
