"""The weights' fan-out in ``embodyrl bench weights``: the learner's egress and each actor's latency
for 1, 4 and 16 actors, linked to the learner directly and through one relay (``embodyrl relay``).

A real :class:`~embodyrl.transport.LearnerServer` in this process publishes weights the size of the
default 256 x 256 DDPG actor on the pendulum (every element changed between publications, as Adam
changes them, so every update is full fp32), ``publications`` of them, one every ``period_s``. The
actors are real :class:`~embodyrl.hal.wire.client.LearnerLink`\\ s, all in one other process,
polled in turn, saying what they hold every :data:`HELD_EVERY_S` (they send no batches); the relay
is a real :class:`~embodyrl.transport.relay.Relay` in a third. Per publication:

* ``learner_egress_bytes_per_publication``: the bytes the learner's socket sent over the run
  (weights, heartbeats, acks) over the publications;
* ``latency_ms_median`` / ``_p90``: from the learner's ``publish`` to an actor holding those weights
  (checksum verified), over every actor and publication (one clock: one machine);
* ``publications_missed``: those an actor never held (it holds the newest once it has the last it
  was sent, so a slow link skips some rather than queue them).

Beside them: egress and latency through the relay over the direct figures at the same actor count
(``egress_ratio_relay_vs_direct``, ``latency_ratio_relay_vs_direct``), and each path's egress at 16
actors over its egress at 1 (``egress_growth_16_vs_1``): flat through a relay, sixteenfold direct.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time

import numpy as np

COUNTS = (1, 4, 16)
HELD_EVERY_S = 0.01
"""How often each link says what it holds (its heartbeat): a real actor says it with every batch, and
the learner (or relay) sends the next weights only to a link that holds the last it was sent."""
SHAPES = {"actor/layer0/w": (3, 256), "actor/layer0/b": (256,), "actor/layer1/w": (256, 256),
          "actor/layer1/b": (256,), "actor/out/w": (256, 1), "actor/out/b": (1,)}
"""The default DDPG actor's parameters on the pendulum: 67,329 float32, 269 KB."""


def _device():
    from ..hal.specs import ArraySpec, DictSpec
    from ..hal.wire.protocol import DeviceInfo

    return DeviceInfo(0, "pendulum", DictSpec.of(ArraySpec("state", (3,), np.float32)),
                      ArraySpec("action", (1,), np.float32, -2, 2))


def _actors(endpoint: str, count: int, report, stop) -> None:
    """``count`` links to ``endpoint``, polled in turn; every (actor, publication count, time held)."""
    from ..hal.wire.client import LearnerLink

    links = [LearnerLink(endpoint, actor_name=f"fan-{i}", actor_id=i, devices=[_device()], handshake_timeout_s=60,
                         heartbeat_s=HELD_EVERY_S) for i in range(count)]
    for link in links:
        link.connect()
    report.put(("connected", count))
    held: list[tuple[int, int, float]] = []
    while not stop.is_set():
        for link in links:
            link.poll(0)
            got = link.take_weights()
            if got is not None:
                held.append((link.actor_id, got[0].count, time.time()))
        time.sleep(0.0005)
    for link in links:
        link.close()
    report.put(("held", held))


def _relay(endpoint: str, report, stop) -> None:
    from ..transport.relay import Relay

    relay = Relay(endpoint, "tcp://127.0.0.1:*", name="bench")
    relay.connect()
    report.put(("relay", relay.endpoint))
    try:
        relay.run(stop.is_set)
    finally:
        report.put(("relay_metrics", relay.metrics()))
        relay.close()


def _serve(server, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        server.poll(1)


def _path(count: int, relayed: bool, publications: int, period_s: float) -> dict:
    from ..hal.steps import PolicyVersion
    from ..transport import LearnerServer

    ctx = mp.get_context("spawn")
    report, stop = ctx.Queue(), ctx.Event()
    server = LearnerServer(run_id="fanout", incarnation=1)
    rng = np.random.default_rng(0)
    processes = []
    try:
        server.publish(PolicyVersion(1, 0), {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()})
        endpoint = server.endpoint
        if relayed:
            processes.append(ctx.Process(target=_relay, args=(server.endpoint, report, stop)))
            processes[-1].start()
            while report.empty():
                _serve(server, 0.05)
            endpoint = report.get()[1]
        processes.append(ctx.Process(target=_actors, args=(endpoint, count, report, stop)))
        processes[-1].start()
        while report.empty():
            _serve(server, 0.05)
        report.get()
        _serve(server, 0.5)  # the first weights out, heartbeats settled
        bytes_before, published = server.stats.bytes_out, {}
        for k in range(1, publications + 1):
            weights = {name: rng.normal(size=s).astype(np.float32) for name, s in SHAPES.items()}
            published[k] = time.time()
            server.publish(PolicyVersion(1, k), weights)
            _serve(server, period_s)
        _serve(server, 0.5)
        egress = server.stats.bytes_out - bytes_before
        stop.set()
        held = None
        deadline = time.monotonic() + 30
        while held is None and time.monotonic() < deadline:
            _serve(server, 0.05)
            while not report.empty():
                kind, value = report.get()
                if kind == "held":
                    held = value
    finally:
        stop.set()
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
        server.close()
    latencies = [1e3 * (t - published[c]) for _, c, t in held or [] if c in published]
    got = {(a, c) for a, c, _ in held or [] if c in published}
    return {"learner_egress_bytes_per_publication": round(egress / publications),
            "latency_ms_median": round(statistics.median(latencies), 2) if latencies else None,
            "latency_ms_p90": round(float(np.percentile(latencies, 90)), 2) if latencies else None,
            "publications_missed": count * publications - len(got)}


def run(quick: bool = False) -> dict:
    publications, period_s = (10, 0.1) if quick else (40, 0.1)
    counts = COUNTS[:2] if quick else COUNTS
    paths = {"direct": {}, "relay": {}}
    for count in counts:
        for name in paths:
            paths[name][str(count)] = _path(count, name == "relay", publications, period_s)
    out: dict = {"actors": list(counts), "publications": publications, "period_s": period_s,
                 "weights_bytes": int(sum(np.prod(s) for s in SHAPES.values()) * 4), **paths}
    key = "learner_egress_bytes_per_publication"
    for count in map(str, counts):
        direct, relay = paths["direct"][count], paths["relay"][count]
        out.setdefault("egress_ratio_relay_vs_direct", {})[count] = round(relay[key] / direct[key], 3)
        if direct["latency_ms_median"] and relay["latency_ms_median"]:
            out.setdefault("latency_ratio_relay_vs_direct", {})[count] = round(
                relay["latency_ms_median"] / direct["latency_ms_median"], 2)
    last = str(counts[-1])
    out["egress_growth_vs_1"] = {name: round(paths[name][last][key] / paths[name]["1"][key], 2) for name in paths}
    out["egress_goal_met"] = out["egress_growth_vs_1"]["relay"] <= 1.25
    out["latency_goal_met"] = all(r <= 2 for r in out.get("latency_ratio_relay_vs_direct", {}).values())
    return out
