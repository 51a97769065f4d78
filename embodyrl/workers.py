"""Process entry points for ``embodyrl train``: the learner and the actors.

Started with the ``spawn`` method: each builds its own ZeroMQ context after
it starts, never inheriting one across a fork.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
import traceback
from pathlib import Path


def _stop_on_signals():
    """A flag set by SIGINT/SIGTERM, so the loops end cleanly and save."""
    state = {"stop": False}

    def handler(signum, frame):
        state["stop"] = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return lambda: state["stop"]


def learner_main(config_dict: dict, run_dir: str, conn) -> None:
    should_stop = _stop_on_signals()
    try:
        from . import envs
        from .config import TrainConfig, from_dict
        from .learner import Learner

        config = from_dict(TrainConfig, config_dict)
        device, _ = envs.make(config.task)
        learner = Learner(config, device.observation_spec, device.action_spec, Path(run_dir))
        conn.send(("ready", learner.endpoint))
        learner.run(should_stop)
        conn.send(("done", dataclasses.asdict(learner.counters)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


def actor_main(config_dict: dict, endpoint: str, index: int, run_dir: str | None = None) -> None:
    """Run actor ``index``; with ``run_dir``, append its stats to ``actor-<index>.jsonl`` each second."""
    should_stop = _stop_on_signals()
    from . import envs
    from .config import TrainConfig, from_dict
    from .hal.actor import ActorLoop
    from .hal.safety import SafeDevice, SafetyConfig
    from .hal.wire.client import LearnerLink
    from .hal.wire.protocol import DeviceInfo
    from .policy import JaxPolicy

    config = from_dict(TrainConfig, config_dict)
    actor_config = dataclasses.replace(config.actor, actor_id=index, seed=config.seed * 1000 + index)
    raw_device, task = envs.make(config.task)
    device = SafeDevice(raw_device, SafetyConfig())  # clipping to the spec, counted
    policy = JaxPolicy(device.observation_spec, device.action_spec, config.off_policy, seed=actor_config.seed)
    info = DeviceInfo(0, config.task, device.observation_spec, device.action_spec)
    link = LearnerLink(endpoint, actor_name=f"actor-{index}", actor_id=index, devices=[info],
                       peer_timeout_s=config.learner.peer_timeout_s)
    log = open(Path(run_dir) / f"actor-{index}.jsonl", "a") if run_dir else None  # noqa: SIM115

    def report(snapshot: dict) -> None:
        log.write(json.dumps({"time": time.time(), "actor": index, **snapshot}) + "\n")
        log.flush()

    try:
        with device, link:
            ActorLoop(device, task, policy, link, actor_config).run(
                should_stop=should_stop, report=report if log else None)
    finally:
        if log:
            log.close()
