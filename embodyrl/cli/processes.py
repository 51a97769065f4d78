"""Process entry points for ``embodyrl train``: the learner and the actors.

Started with the ``spawn`` method: each builds its own ZeroMQ context after
it starts, never inheriting one across a fork.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

import numpy as np

DEBUG_ENV = "EMBODYRL_DEBUG"
"""Set (``embodyrl --debug``): a failing device or driver raises with its traceback instead of one line."""


def device_failed(who: str, err: BaseException) -> NoReturn:
    """Raise ``SystemExit(1)`` after one line naming what failed (a driver's fault, an observation off its
    spec); with ``embodyrl --debug``, ``err`` itself, traceback and all."""
    if os.environ.get(DEBUG_ENV) == "1":
        raise err
    print(f"embodyrl: {who}: the device failed: {type(err).__name__}: {err} "
          "(embodyrl --debug COMMAND ... shows the traceback)", file=sys.stderr, flush=True)
    raise SystemExit(1) from None


class StopFlag:
    """Called: whether SIGINT/SIGTERM arrived, so the loops end cleanly and save.
    :meth:`insisted`: a second one did (an actor's final flush gives up)."""

    def __init__(self):
        self.signals = 0

    def __call__(self) -> bool:
        return self.signals > 0

    def insisted(self) -> bool:
        return self.signals > 1


def stop_on_signals() -> StopFlag:
    """A :class:`StopFlag` counting SIGINT/SIGTERM."""
    flag = StopFlag()

    def handler(signum, frame):
        flag.signals += 1

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return flag


def learner_main(config_dict: dict, run_dir: str, conn, security: dict | None = None) -> None:
    """Run the learner; ``security``: its ``keys``/``allow_insecure`` keyword arguments (CurveZMQ)."""
    should_stop = stop_on_signals()
    try:
        from ..config import TrainConfig, from_dict
        from ..learner import make_learner

        config = from_dict(TrainConfig, config_dict)
        learner = make_learner(config, Path(run_dir), **(security or {}))
        conn.send(("ready", learner.endpoint))
        learner.run(should_stop)
        conn.send(("done", dataclasses.asdict(learner.counters)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise
    finally:
        conn.close()


def goodbye_note(reason: str, spool, spool_dir: str | None) -> str:
    """What the rows the learner did not take when it said goodbye become: kept for the next start, or not."""
    rows = f"{spool.rows} rows in {len(spool)} batch{'es' if len(spool) != 1 else ''}"
    if spool_dir:
        return (f"the learner said goodbye ({reason}); {rows} it did not take wait in the spool at {spool_dir} "
                "and go to it when this actor starts again: nothing is lost")
    return (f"the learner said goodbye ({reason}); {rows} it did not take are dropped with this actor "
            "(its spool is in memory only: set actor.spool_dir to keep them for a resumed run)")


def actor_seed(run_seed: int, index: int, resumed_at_rows: int = 0) -> int:
    """Actor ``index``'s seed: ``run_seed * 1000 + index`` in a new run. A resumed start's is drawn from
    the rows the run held, so its scenes and exploration are new, not the first start's once more
    (a simulator reseeded alike would hand every start the same episodes)."""
    if resumed_at_rows == 0:
        return run_seed * 1000 + index
    return int(np.random.SeedSequence([run_seed, index, resumed_at_rows]).generate_state(1)[0] >> 1)


def actor_main(config_dict: dict, endpoint: str, index: int, run_dir: str | None = None,
               max_steps: int | None = None, *, keys=None, allow_insecure: bool = False) -> None:
    """Run actor ``index`` until the learner says goodbye, a signal, or ``max_steps`` control steps.

    With ``run_dir`` it appends its stats to ``actor-<index>.jsonl`` each second and keeps
    ``actor-<index>.ledger.jsonl``, one line per batch its link took (see
    :mod:`embodyrl.hal.ledger`). With ``actor.spool_dir`` its unacknowledged batches live on disk
    and a restart resends them. After its last step it resends until the learner has acknowledged
    everything it spooled (the learner may be restarting), for at most ``actor.flush_timeout_s``
    or until a second signal; then it raises :class:`~embodyrl.hal.wire.client.Undelivered`
    (``embodyrl actor`` exits 1), saying how many rows its spool still holds. So does any other
    :class:`LinkError` that ends it with rows unacknowledged. ``keys`` (``ClientKeys``) secure its
    link with CurveZMQ; without them it dials only loopback unless ``allow_insecure``.
    """
    should_stop = stop_on_signals()
    from ..config import TrainConfig, from_dict
    from ..hal.actor import ActorLoop
    from ..hal.console import dial_console
    from ..hal.ledger import BatchLedger
    from ..hal.wire.client import LearnerLink, LinkError, Undelivered
    from ..hal.wire.spool import Spool
    from .person import LearnerNews, close_parts, needs_real_pace, person_parts

    config = from_dict(TrainConfig, config_dict)
    ac = config.actor
    actor_config = dataclasses.replace(ac, actor_id=index, seed=actor_seed(config.seed, index, ac.resumed_at_rows))
    runtime = actor_runtime()
    print(f"embodyrl: actor {index}: acting with the {RUNTIMES[runtime]}", file=sys.stderr, flush=True)
    group, tasks, policies, infos = actor_parts(config, actor_config.seed, runtime)
    teleop, operator = person_parts(config, group, index)
    if needs_real_pace(config):
        actor_config = dataclasses.replace(actor_config, realtime=True)
    news = LearnerNews(index, policies)
    spool = Spool(Path(ac.spool_dir) / f"actor-{index}" if ac.spool_dir else None,
                  disk_bytes=ac.spool_disk_mb << 20, on_full=ac.spool_on_full)
    ledger = BatchLedger(Path(run_dir) / f"actor-{index}.ledger.jsonl") if run_dir else None
    if ledger is not None:
        ledger.reconcile(spool)
    link = LearnerLink(endpoint, actor_name=f"actor-{index}", actor_id=index, devices=infos,
                       peer_timeout_s=config.learner.peer_timeout_s, handshake_timeout_s=ac.handshake_timeout_s,
                       spool=spool, keys=keys, allow_insecure=allow_insecure, on_sent=ledger.record if ledger else None,
                       policy_graphs=runtime == "numpy")
    log = open(Path(run_dir) / f"actor-{index}.jsonl", "a") if run_dir else None  # noqa: SIM115
    console = dial_console(config.console, role="actor", actor_id=index, console_key=config.console_key,
                           own_secret_key=keys.secret_key_file if keys else None, allow_insecure=allow_insecure)

    def report(snapshot: dict) -> None:
        news(snapshot)
        if log is not None:
            log.write(json.dumps({"time": time.time(), "actor": index, **snapshot}) + "\n")
            log.flush()

    try:
        with group, link:
            if runtime == "numpy":
                policies.update(numpy_policies(link, group, actor_config.seed))
            ActorLoop(group, tasks, policies, link, actor_config, intervention=teleop, operator=operator,
                      console=console).run(max_steps=max_steps, should_stop=should_stop, report=report)
            if link.bye_reason is None:
                link.drain(ac.flush_timeout_s, should_stop=should_stop.insisted)
            elif len(spool):
                print(f"embodyrl: actor {index}: {goodbye_note(link.bye_reason, spool, ac.spool_dir)}",
                      file=sys.stderr)
    except LinkError as err:
        if isinstance(err, Undelivered) or not len(spool):
            raise
        raise Undelivered(str(err), spool) from err
    except Exception as err:  # noqa: BLE001 - a driver's fault or a spec mismatch: one line, not a traceback
        device_failed(f"actor {index}", err)
    finally:
        close_parts(teleop, operator)
        if console is not None:
            console.close()
        for file in (log, ledger):
            if file is not None:
                file.close()


RUNTIMES = {"jax": "learner's JAX policy", "numpy": "numpy runtime (the learner sends each policy's graph)"}


def actor_runtime() -> str:
    """How an actor computes its actions: ``jax`` where JAX is installed, else ``numpy``
    (:class:`~embodyrl.hal.runtime.NumpyPolicy`, the same formulas, on the graphs the learner sends)."""
    try:
        import jax  # noqa: F401 - the JAX policy imports it next anyway
    except ImportError:
        return "numpy"
    return "jax"


def numpy_policies(link, group, seed: int) -> dict:
    """Member name -> :class:`~embodyrl.hal.runtime.NumpyPolicy` from the exports the link's WELCOME
    brought; a device without one stops the actor, saying why."""
    from ..hal.runtime import ExportError, NumpyPolicy
    from ..hal.wire.client import LinkError

    policies = {}
    for member, device_id in ((m.name, m.device_id) for m in group.members):
        export = link.policy_exports.get(device_id, "the learner sent no policy graph for it")
        if isinstance(export, str):
            raise LinkError(f"no policy for device {device_id} ({member}): {export}")
        try:
            policies[member] = NumpyPolicy(*export, seed=seed + device_id)
        except ExportError as err:
            raise LinkError(f"the learner's policy for device {device_id} ({member}) is malformed: {err}") from None
    return policies


def actor_parts(config, seed: int, runtime: str = "jax"):
    """(group of safe devices, tasks, policies, device infos), tasks and policies keyed by member
    name: one device of each kind of the task's layout, device id = its kind's index. With the
    ``numpy`` runtime the policies are left empty: :func:`numpy_policies` fills them once connected."""
    from .. import envs
    from ..hal.group import DeviceGroup
    from ..hal.safety import SafeDevice, SafetyConfig
    from ..hal.wire.protocol import DeviceInfo
    from ..robot import of_config

    robot = of_config(config)
    layout = robot.layout()
    devices, ids, tasks, policies, infos = {}, {}, {}, {}, []
    for device_id, kind in enumerate(layout.kinds):
        member = envs.member_name(kind.name)
        raw, tasks[member] = robot.make(kind.name)
        safe = raw if isinstance(raw, SafeDevice) else SafeDevice(raw, SafetyConfig())  # a robot file's limits
        devices[member], ids[member] = safe, device_id  # clipping to the spec, counted
        if runtime == "jax":
            from ..policy import JaxPolicy

            policies[member] = JaxPolicy(config.algo, layout, device_id, seed=seed + device_id)
        infos.append(DeviceInfo(device_id, kind.name, raw.observation_spec, raw.action_spec))
    return DeviceGroup(devices, ids), tasks, policies, infos
