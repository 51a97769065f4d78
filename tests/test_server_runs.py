"""A session's small batches queued at one poll are checked and handed on as one, and a bad batch
among them is refused alone (its neighbours still reach the replay)."""

import dataclasses

import numpy as np
import zmq

from embodyrl.bench.chaos_hostile import Rows, hello_frames
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.codec import decode, encode
from embodyrl.transport import LearnerServer


def _connected(endpoint: str, server: LearnerServer, rows: Rows) -> zmq.Socket:
    """A DEALER on the server's inproc endpoint, welcomed with two devices: what it sends is queued
    at once, so one poll sees every message sent before it."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    frames = hello_frames(rows.info, 3, "runs")
    hello = decode(frames)
    devices = [rows.info.to_msg(), dataclasses.replace(rows.info, device_id=1).to_msg()]
    sock.send_multipart(encode(P.HELLO, {**hello.fields, "devices": devices}, protocol=hello.protocol))
    while not server.sessions:
        server.poll(20)
    assert decode(sock.recv_multipart()).kind == P.WELCOME
    return sock


def _send(sock: zmq.Socket, seq: int, arrays: dict, device_id: int = 0) -> None:
    arrays = {**arrays, "device_id": np.full_like(arrays["device_id"], device_id)}
    sock.send_multipart(encode(P.STEPS, {"seq": seq, "device_id": device_id, "held": [0, -1]}, arrays))


def test_queued_batches_are_joined_in_order_and_only_the_bad_one_is_refused():
    rows = Rows(3)
    endpoint = "inproc://server-runs"
    server = LearnerServer(endpoint, run_id="r", incarnation=1)
    sock = _connected(endpoint, server, rows)
    try:
        for seq in (1, 2, 3):
            _send(sock, seq, rows.arrays)
        (joined,) = server.poll(100)
        assert (joined.device_id, joined.seq, len(joined.steps)) == (0, 3, 12)
        for name, column in joined.steps.arrays().items():  # every column, in the order sent
            np.testing.assert_array_equal(column, np.concatenate([rows.arrays[name]] * 3), err_msg=name)
        assert server.sessions[joined.session.identity].received_seq == 3

        _send(sock, 4, rows.arrays)
        _send(sock, 5, rows.spoiled("nan_rows"))
        _send(sock, 6, rows.arrays)
        _send(sock, 7, rows.arrays, device_id=1)  # another device ends the run: the order holds
        _send(sock, 8, rows.arrays)
        _send(sock, 8, rows.arrays)  # a duplicate of a batch in the run: dropped
        batches = server.poll(100)
        assert [(b.device_id, b.seq, len(b.steps)) for b in batches] == [(0, 4, 4), (0, 6, 4), (1, 7, 4), (0, 8, 4)]
        assert server.stats.rejected == {"steps_invalid": 1}
        assert server.stats.seq_gaps == 1  # 6 after 4: the refused 5 is never taken
        assert server.stats.duplicates == 1
    finally:
        sock.close(0)
        server.close()

