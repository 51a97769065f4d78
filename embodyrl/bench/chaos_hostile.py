"""Attackers of the learner: process targets for the hostile chaos scenario (``chaos_link.hostile``).

Each attacker is its own process (``spawn``), niced so that on a small
machine the figures measure the learner rather than the share of cores the
attackers take, and sends as fast as the learner's socket takes its
messages. Four kinds, each holding the sockets its attacks need:

* ``session``: an authorised key with a session of its own. Rows with NaN
  and Inf, actions out of bounds, wrong shapes and dtypes; a replayed and a
  future sequence number; a ``held`` version and a row policy version the
  learner never published; a shape declaring 1 GiB; a header describing more
  frames than sent; a sessionless socket (same key) sending steps; a HELLO
  claiming the honest actor's index.
* ``bombs``: zstd frames of 32 KiB declaring 1 GiB, before HELLO (a socket
  with no session) and after it. A replayed batch after each round is the
  pacing probe: its acknowledgement says the learner has read the round.
* ``flood``: HELLOs at full speed from one key (a plain and a 60 KiB one),
  never reading the answers; and a slow reader, a session that keeps itself
  alive with heartbeats and never reads its socket, so weights pile up
  toward it.
* ``raw``: plain TCP, no key: a ZMTP greeting cut off mid-way, and a full
  CURVE greeting followed by a command frame declaring 1 GiB that stops
  after a few MiB (held open until more connections need room).

The control pipe speaks three messages: the attacker sends ``("ready",
classes)`` once its sessions stand; ``("probe", class, n)`` asks it to send
``n`` of one class and answers ``("sent", n)``; when ``stop`` is set it sends
``("counts", {class: sent})`` of what it sent while ``attack`` was set.
"""

from __future__ import annotations

import collections
import os
import secrets
import socket
import struct
import time
from pathlib import Path

import numpy as np

REFUSED_AS = {
    "nan_rows": "steps_invalid", "inf_rows": "steps_invalid", "action_out_of_bounds": "steps_invalid",
    "wrong_shape": "steps_invalid", "wrong_dtype": "steps_invalid", "replayed_seq": "duplicate",
    "future_seq": "seq_gap", "forged_held": "policy_version", "forged_row_version": "policy_version",
    "oversized_shape": "frame_size", "half_sent": "frame_count", "garbage": "header_malformed",
    "no_session": "unknown_peer", "index_claim": "index_taken", "bomb_before_hello": "frame_size",
    "bomb_after_hello": "frame_size", "hello_flood": "hello_rate", "fat_hello_flood": "hello_rate",
    "slow_reader": None, "zmtp_cut_greeting": None, "zmtp_cut_frame": None,
}
"""Attack class -> the reason the learner counts it under. Two are taken, not refused:
``duplicate`` (acknowledged and dropped) and ``seq_gap`` (a batch past a gap is stored and counted:
a spool set to drop its oldest batches skips seqs; the attacker only skips its own). None: never a
message the server refuses: the slow reader is a session it keeps (its weights resends back off),
raw TCP never completes a handshake."""
BOMB_BYTES = 1 << 30
RAW_HOLD = 12
RAW_PAYLOAD = 4 << 20


def attacker(role: str, endpoint: str, key_files: tuple[str, str] | None, actor_id: int, victim_id: int,
             attack, stop, control, niceness: int = 10) -> None:
    """Process target: build the ``role``'s kit, then probe on request and flood while ``attack``."""
    os.nice(niceness)
    kit = KITS[role](endpoint, key_files, actor_id, victim_id)
    sent: collections.Counter = collections.Counter()
    try:
        kit.setup(stop)
        control.send(("ready", list(kit.classes)))
        while not stop.is_set():
            if control.poll():
                _, name, n = control.recv()
                control.send(("sent", kit.send_n(name, n, stop)))
            if attack.is_set():
                kit.flood(sent, stop)
            else:
                kit.idle()
                time.sleep(0.002)
        control.send(("counts", dict(sent)))
    finally:
        kit.close()


def _bomb(nbytes: int = BOMB_BYTES, block: int = 128 << 10) -> bytes:
    """A zstd frame of ``nbytes`` zeros written by hand: run-length blocks of 128 KiB, each 4 bytes
    (32 KiB for 1 GiB), with the content size in the frame header."""
    header = struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", nbytes)  # single segment, 8-byte size
    rle, last = ((struct.pack("<I", (block << 3) | 2 | final)[:3] + b"\0") for final in (0, 1))
    return header + rle * (nbytes // block - 1) + last


class Rows:
    """Four valid pendulum rows of one actor, and the ways to spoil them."""

    def __init__(self, actor_id: int):
        from embodyrl import envs
        from embodyrl.hal.steps import NO_POLICY, StepRecorder
        from embodyrl.hal.wire.protocol import DeviceInfo

        device, _ = envs.make("pendulum")
        self.info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
        rec = StepRecorder(device.observation_spec, device.action_spec, actor_id=actor_id, device_id=0)
        with device:
            obs = device.reset(seed=actor_id)
            for _ in range(4):
                rec.add(obs, np.zeros(1, np.float32), np.zeros(1, np.float32), 0.0, False, False, NO_POLICY)
        self.arrays = rec.flush().arrays()
        self.obs = next(k for k in self.arrays if k.startswith("observation/"))

    def spoiled(self, how: str, incarnation: int = 0) -> dict:
        a = dict(self.arrays)
        column = a[self.obs]
        if how == "nan_rows":
            a[self.obs] = np.full_like(column, np.nan)
        elif how == "inf_rows":
            a[self.obs] = np.full_like(column, np.inf)
        elif how == "action_out_of_bounds":
            a["action"] = a["proposed_action"] = np.full_like(a["action"], 1e3)
        elif how == "wrong_shape":
            a[self.obs] = np.zeros((len(column), column.shape[1] + 3), column.dtype)
        elif how == "wrong_dtype":
            a[self.obs] = column.astype(np.float64)
        elif how == "forged_row_version":
            a["policy_incarnation"] = np.full_like(a["policy_incarnation"], incarnation)
            a["policy_count"] = np.full_like(a["policy_count"], 10**9)
        return a


def _dealer(context, endpoint: str, key_files):
    import zmq

    from embodyrl.hal.wire.security import ClientKeys, secure_client

    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 1000)
    if key_files:
        secure_client(sock, ClientKeys(*(Path(f) for f in key_files)))
    sock.connect(endpoint)
    return sock


def _send(sock, frames) -> int:
    """1 if the socket took the message now, 0 if its queue is full (never blocks)."""
    import zmq

    try:
        sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        return 1
    except zmq.Again:
        return 0


def hello_frames(info, actor_id: int, instance: str, devices: int = 1) -> list:
    """A HELLO for ``actor_id`` declaring ``devices`` copies of ``info``."""
    from embodyrl.hal.steps import NO_POLICY
    from embodyrl.hal.wire import protocol as P
    from embodyrl.hal.wire.codec import PROTOCOL_VERSION, encode

    return encode(P.HELLO, {"actor": f"attacker-{actor_id}", "actor_id": actor_id,
                            "devices": [info.to_msg()] * devices, "last_acked_seq": 0, "held": list(NO_POLICY),
                            "protocol": PROTOCOL_VERSION, "instance": instance}, protocol=P.HELLO_PROTOCOL)


class Session:
    """A keyed DEALER with a session: HELLO, WELCOME, one valid batch stored (seq 1), acks tracked."""

    classes: tuple[str, ...] = ()

    def __init__(self, endpoint, key_files, actor_id, victim_id):
        import zmq

        self.endpoint, self.key_files, self.actor_id, self.victim_id = endpoint, key_files, actor_id, victim_id
        self.context = zmq.Context()
        self.rows = Rows(actor_id)
        self.sock = _dealer(self.context, endpoint, key_files)
        self.instance = secrets.token_hex(8)
        self.incarnation = self.committed = self.highest = 0
        self.refused: str | None = None

    def hello(self, actor_id: int | None = None) -> list:
        return hello_frames(self.rows.info, self.actor_id if actor_id is None else actor_id, self.instance)

    def steps(self, seq: int, arrays: dict | None = None, held=None, **extra) -> list:
        from embodyrl.hal.steps import NO_POLICY
        from embodyrl.hal.wire import protocol as P
        from embodyrl.hal.wire.codec import encode

        return encode(P.STEPS, {"seq": seq, "device_id": 0, "held": list(held or NO_POLICY), **extra},
                      self.rows.arrays if arrays is None else arrays)

    def drain(self) -> None:
        """Read what the learner sent: WELCOME, ACKs, REFUSED (weights are read and dropped)."""
        import zmq

        from embodyrl.hal.wire import protocol as P
        from embodyrl.hal.wire.codec import MessageError, decode

        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg = decode(frames)
            except MessageError:
                continue
            if msg.kind == P.WELCOME:
                self.incarnation, self.committed = msg.fields["incarnation"], msg.fields["committed_seq"]
            elif msg.kind == P.ACK:
                self.committed = max(self.committed, msg.fields["seq"])
            elif msg.kind in (P.REFUSED, P.BYE):
                self.refused = str(msg.fields.get("reason"))

    def wait(self, done, stop, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline and not stop.is_set():
            self.sock.poll(20)
            self.drain()
        return done()

    def setup(self, stop) -> None:
        self.sock.send_multipart(self.hello())
        if not self.wait(lambda: self.incarnation, stop, 60):
            raise RuntimeError(f"attacker {self.actor_id}: no WELCOME ({self.refused})")
        self.sock.send_multipart(self.steps(self.committed + 1))
        if not self.wait(lambda: self.committed >= 1, stop, 60):
            raise RuntimeError(f"attacker {self.actor_id}: its valid batch was never acknowledged")

    def send_n(self, name: str, n: int, stop) -> int:
        sent, deadline = 0, time.monotonic() + 5
        while sent < n and time.monotonic() < deadline and not stop.is_set():
            took = self.send(name)
            sent += took
            if not took:
                time.sleep(0.001)
            self.drain()
        return sent

    def flood(self, sent, stop) -> None:
        for name in self.classes:
            sent[name] += self.send(name)
        self.drain()

    def idle(self) -> None:
        self.drain()

    def close(self) -> None:
        self.context.destroy(linger=0)


class SessionAttacks(Session):
    classes = ("nan_rows", "inf_rows", "action_out_of_bounds", "wrong_shape", "wrong_dtype", "replayed_seq",
               "future_seq", "forged_held", "forged_row_version", "oversized_shape", "half_sent", "garbage",
               "no_session", "index_claim")

    def __init__(self, *args):
        super().__init__(*args)
        self.stranger = _dealer(self.context, self.endpoint, self.key_files)  # never says HELLO
        self.claimer = _dealer(self.context, self.endpoint, self.key_files)  # HELLO as the victim
        self.rng = np.random.default_rng(self.actor_id)

    def send(self, name: str) -> int:
        import msgpack

        from embodyrl.hal.wire import protocol as P
        from embodyrl.hal.wire.codec import PROTOCOL_VERSION

        nxt = self.committed + 1
        if name in ("nan_rows", "inf_rows", "action_out_of_bounds", "wrong_shape", "wrong_dtype"):
            return _send(self.sock, self.steps(nxt, self.rows.spoiled(name)))
        if name == "forged_row_version":
            return _send(self.sock, self.steps(nxt, self.rows.spoiled(name, self.incarnation)))
        if name == "replayed_seq":
            return _send(self.sock, self.steps(1))
        if name == "future_seq":  # beyond anything sent yet
            self.highest = max(self.highest, nxt) + 1000
            return _send(self.sock, self.steps(self.highest))
        if name == "forged_held":
            return _send(self.sock, self.steps(nxt, held=(self.incarnation, 10**9)))
        if name == "oversized_shape":  # 1 GiB declared, 16 bytes sent
            header = {"p": PROTOCOL_VERSION, "k": P.STEPS, "f": {"seq": nxt, "device_id": 0, "held": [0, -1]},
                      "a": [[self.rows.obs, "float32", [1 << 27, 2]]]}
            return _send(self.sock, [msgpack.packb(header), b"\0" * 16])
        if name == "half_sent":  # the header describes a frame that never comes
            return _send(self.sock, self.steps(nxt)[:1])
        if name == "garbage":
            return _send(self.sock, [self.rng.bytes(int(self.rng.integers(1, 200)))])
        if name == "no_session":
            return _send(self.stranger, self.steps(nxt))
        if name == "index_claim":
            return _send(self.claimer, self.hello(actor_id=self.victim_id))
        raise KeyError(name)

    def drain(self) -> None:
        super().drain()
        import zmq

        while True:  # the claimer's answers (REFUSED, or a stolen session's WELCOME and weights)
            try:
                self.claimer.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break


class BombAttacks(Session):
    classes = ("bomb_before_hello", "bomb_after_hello")

    def __init__(self, *args):
        super().__init__(*args)
        self.stranger = _dealer(self.context, self.endpoint, self.key_files)
        self.payload = _bomb()

    def send(self, name: str) -> int:
        import msgpack

        from embodyrl.hal.wire import protocol as P
        from embodyrl.hal.wire.codec import PROTOCOL_VERSION

        header = {"p": PROTOCOL_VERSION, "k": P.STEPS, "f": {"seq": self.committed + 1, "device_id": 0,
                                                              "held": [0, -1]},
                  "a": [[self.rows.obs, "float32", [BOMB_BYTES // 4], "zstd"]]}
        sock = self.stranger if name == "bomb_before_hello" else self.sock
        return _send(sock, [msgpack.packb(header), self.payload])

    def flood(self, sent, stop) -> None:
        """A round of bombs, then a replayed batch, whose acknowledgement (in order, on the same
        connection) says the learner has read the round: as fast as the learner takes them."""
        super().flood(sent, stop)
        acked = self.committed
        self.committed = 0  # the duplicate's ACK names seq 1 again: wait for it
        self.sock.send_multipart(self.steps(1))
        if not self.wait(lambda: self.committed >= 1, stop, 5.0):
            self.committed = acked


class FloodAttacks:
    """HELLOs at full speed (a flooder key, never reading) and a slow reader (a sloth key)."""

    classes = ("hello_flood", "fat_hello_flood", "slow_reader")

    def __init__(self, endpoint, key_files, actor_id, victim_id):
        import zmq

        self.context = zmq.Context()
        flooder_keys, sloth_keys = key_files
        info, instance = Rows(actor_id).info, secrets.token_hex(8)
        self.hellos = [hello_frames(info, actor_id, instance), hello_frames(info, actor_id, instance, devices=240)]
        self.flood_sock = _dealer(self.context, endpoint, flooder_keys)
        self.sloth = _dealer(self.context, endpoint, sloth_keys)
        self.sloth_hello = hello_frames(info, actor_id + 1, secrets.token_hex(8))
        self.beat = 0.0

    def setup(self, stop) -> None:
        self.sloth.send_multipart(self.sloth_hello)  # it never reads the WELCOME, nor anything after

    def _heartbeat(self) -> int:
        from embodyrl.hal.steps import NO_POLICY
        from embodyrl.hal.wire import protocol as P
        from embodyrl.hal.wire.codec import encode

        self.beat = time.monotonic()
        return _send(self.sloth, encode(P.HEARTBEAT, {"time": time.time(), "held": list(NO_POLICY)}))

    def send(self, name: str) -> int:
        if name == "slow_reader":
            return self._heartbeat()
        return _send(self.flood_sock, self.hellos[name == "fat_hello_flood"])

    def send_n(self, name: str, n: int, stop) -> int:
        return sum(self.send(name) for _ in range(n))

    def flood(self, sent, stop) -> None:
        for name in ("hello_flood", "fat_hello_flood"):
            took = self.send(name)
            sent[name] += took
            if not took:
                time.sleep(0.001)
        self.idle()

    def idle(self) -> None:
        if time.monotonic() - self.beat > 0.5:  # keeps its session, still reads nothing
            self._heartbeat()

    def close(self) -> None:
        self.context.destroy(linger=0)


class RawAttacks:
    """Plain TCP at the learner's port: ZMTP cut off mid-greeting, and a CURVE greeting followed
    by a command frame declaring 1 GiB that stops after ``RAW_PAYLOAD`` bytes."""

    classes = ("zmtp_cut_greeting", "zmtp_cut_frame")
    GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + b"\x00" + b"\0" * 31

    def __init__(self, endpoint, key_files, actor_id, victim_id):
        host, port = endpoint[len("tcp://"):].rsplit(":", 1)
        self.address = (host, int(port))
        self.open: collections.deque = collections.deque()
        self.payload = b"\x05HELLO" + bytes(RAW_PAYLOAD)
        self.cut = 0
        """Connections the server closed before it took the whole payload."""

    def setup(self, stop) -> None:
        pass

    def send(self, name: str) -> int:
        while len(self.open) >= RAW_HOLD:
            self.open.popleft().close()
        try:
            conn = socket.create_connection(self.address, timeout=1.0)
        except OSError:
            return 0
        try:
            if name == "zmtp_cut_greeting":
                conn.sendall(self.GREETING[:13])
            else:
                conn.sendall(self.GREETING + b"\x06" + struct.pack(">Q", 1 << 30))
                conn.sendall(self.payload)
        except OSError:  # the server cut it (a frame past its size cap): the attack was made, and failed
            self.cut += 1
        self.open.append(conn)
        return 1

    def send_n(self, name: str, n: int, stop) -> int:
        return sum(self.send(name) for _ in range(n))

    def flood(self, sent, stop) -> None:
        for name in self.classes:
            sent[name] += self.send(name)

    def idle(self) -> None:
        while self.open:
            self.open.popleft().close()

    def close(self) -> None:
        self.idle()


KITS = {"session": SessionAttacks, "bombs": BombAttacks, "flood": FloodAttacks, "raw": RawAttacks}
