"""A real-time actor never blocks on a dead learner: it spools, then pauses its devices safely."""

import threading
import time
import warnings

import numpy as np

from embodyrl import envs
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.policy import UniformRandomPolicy
from embodyrl.hal.safety import SafeDevice, SafetyConfig
from embodyrl.hal.wire import protocol as P
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.spool import Spool
from embodyrl.transport import LearnerServer


def connected_link(spool, peer_timeout_s=0.5):
    device, _ = envs.make("pendulum")
    server = LearnerServer(run_id="r", incarnation=1)
    info = P.DeviceInfo(0, "p", device.observation_spec, device.action_spec)
    link = LearnerLink(server.endpoint, actor_name="rt", actor_id=0, devices=[info], handshake_timeout_s=5,
                       peer_timeout_s=peer_timeout_s, spool=spool)
    stop = threading.Event()
    pump = threading.Thread(target=lambda: [server.poll(10) for _ in iter(stop.is_set, True)], daemon=True)
    pump.start()
    link.connect()
    stop.set()
    pump.join()
    server.close()  # the learner dies right after the handshake
    return link


def test_realtime_actor_keeps_its_rate_then_pauses_safely_when_the_spool_fills():
    link = connected_link(Spool(disk_bytes=8_000))  # room for a few batches only
    device, task = envs.make("pendulum")
    safe = SafeDevice(device, SafetyConfig(safe_action=(0.0,)))
    steps = 150  # 3 s at the pendulum's 50 Hz
    loop = ActorLoop(safe, task, UniformRandomPolicy(safe.action_spec, seed=0), link,
                     ActorConfig(send_every=16, random_steps=10**9, realtime=True))
    with safe, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.monotonic()
        stats = loop.run(max_steps=steps)
        elapsed = time.monotonic() - start
    assert elapsed < steps * safe.control_period_s * 1.5 + 1.0, "the loop blocked on the network"
    assert stats.pauses == 1 and stats.paused_steps > 0
    assert stats.env_steps + stats.paused_steps == steps
    assert any("devices paused in their safe state" in str(w.message) for w in caught)
    assert np.array_equal(safe.last_applied, [0.0])  # the safe action was the last command
    assert len(link.spool) > 0  # nothing was dropped: every batch waits for the learner


def test_drop_oldest_spool_keeps_the_actor_running_and_counts_losses():
    spool = Spool(disk_bytes=8_000, on_full="drop_oldest")
    link = connected_link(spool)
    device, task = envs.make("pendulum")
    loop = ActorLoop(device, task, UniformRandomPolicy(device.action_spec, seed=0), link,
                     ActorConfig(send_every=16, random_steps=10**9, realtime=True))
    with device:
        stats = loop.run(max_steps=150)
    assert stats.pauses == 0 and stats.env_steps == 150
    assert spool.dropped_batches > 0 and spool.bytes_total <= 8_000
