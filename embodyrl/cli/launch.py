"""``embodyrl train``: a learner process and actor processes on this machine.

The parent starts the learner, learns its endpoint, starts the actors
pointed at it, shows progress from the learner's ``metrics.jsonl``, and on
completion or Ctrl-C stops every child (SIGTERM, then SIGKILL after a grace
period) so that no process or port outlives the run. It then evaluates the
saved policy against a uniform random policy on the same seeded episodes
and writes ``summary.json``.

The children come from a fork server started for the run: it imports what every
learner and actor imports (JAX, flax, the algorithms, the HAL) once, and forks
each child from there, where the ``spawn`` method imported them again in each
child (about 2 s of CPU apiece). Nothing in the server has touched a JAX
device or a ZeroMQ context, so forking it is safe; it starts from the run's
environment and stops with the run, as spawned children would.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import multiprocessing.forkserver
import time
from contextlib import contextmanager
from pathlib import Path

from ..config import TrainConfig, save, to_dict
from ..runlog import learner_records
from .display import Display
from .processes import actor_main, learner_main

START_TIMEOUT_S = 600.0
"""Longest wait for the learner to listen (JAX start-up and the first compiles on a loaded machine)."""
GRACE_S = 15.0


CHILD_MODULES = ("embodyrl.cli.processes", "embodyrl.config", "embodyrl.learner", "embodyrl.policy",
                 "embodyrl.hal.actor", "embodyrl.envs")
"""What the learner and actor processes import, loaded once in the run's fork server."""


class TrainingError(RuntimeError):
    pass


@contextmanager
def children():
    """The multiprocessing context the run's children start from: a fork server with
    :data:`CHILD_MODULES` imported, stopped on the way out (a later run's server then starts
    from that run's environment, as a spawned child would)."""
    if "forkserver" not in mp.get_all_start_methods():  # Windows: spawned, importing everything again
        yield mp.get_context("spawn")
        return
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(CHILD_MODULES))
    try:
        yield ctx
    finally:
        server = getattr(multiprocessing.forkserver, "_forkserver", None)
        stop = getattr(server, "_stop", None)  # the standard library's own way to stop its server
        if stop is not None:
            stop()


def _stop(processes, grace_s: float = GRACE_S) -> None:
    processes = [p for p in processes if p.pid is not None]  # started ones
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)


def train(config: TrainConfig, run_dir: Path, quiet: bool = False, progress: str = "auto", *,
          keys: tuple | None = None, allow_insecure: bool = False) -> dict:
    """Run ``config`` into ``run_dir``; ``progress`` is a display mode of :mod:`embodyrl.cli.display`.

    ``keys``: a ``(ServerKeys, ClientKeys)`` pair securing the link with CurveZMQ
    (:func:`embodyrl.cli.security.local_key_pairs`); ``allow_insecure`` lets a
    non-loopback ``learner.bind`` go without them.
    """
    server_keys, client_keys = keys if keys is not None else (None, None)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if config.synchronous:
        from ..learner.synchronous import synchronous_config

        config = synchronous_config(config)
    save(config, run_dir / "config.json")
    started = time.monotonic()
    if config.synchronous:
        _run_inline(config, run_dir, quiet, progress)
    else:
        with children() as ctx:
            _run_processes(ctx, config, run_dir, quiet, progress, server_keys, client_keys, allow_insecure)
    last = _last_metrics(run_dir)
    summary = {"env_steps": last["env_steps"], "wall_s": round(time.monotonic() - started, 1)}
    summary.update(evaluate_run(config, run_dir))
    if "policy_age_distribution" in last:
        summary["policy_age"] = last["policy_age_distribution"]
    if config.eval_every and "eval_skipped" not in summary:
        from .evaluate import evaluate_snapshots

        summary["evals"] = [{"env_steps": row["env_steps"], "updates": row["updates"],
                             **({"return_mean": row["return_mean"]} if "return_mean" in row else {}),
                             "devices": {name: d["return_mean"] for name, d in row["devices"].items()}}
                            for row in evaluate_snapshots(config, run_dir)]
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _run_processes(ctx, config: TrainConfig, run_dir: Path, quiet: bool, progress: str, server_keys, client_keys,
                   allow_insecure: bool) -> None:
    """The learner, then the actors pointed at it, until the learner reports ``done``; every child
    stopped on the way out, whatever happened."""
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    learner = ctx.Process(target=learner_main, name="embodyrl-learner",
                          args=(to_dict(config), str(run_dir), child_conn),
                          kwargs={"security": {"keys": server_keys, "allow_insecure": allow_insecure}
                                  if server_keys is not None or allow_insecure else None})
    processes = [learner]
    progress = Display(run_dir / "metrics.jsonl", config.steps, "quiet" if quiet else progress,
                       title=f"embodyrl train {config.task}")
    try:
        progress.start()
        learner.start()
        child_conn.close()
        endpoint = _expect(parent_conn, learner, "ready", START_TIMEOUT_S)
        (run_dir / "learner.json").write_text(json.dumps({"endpoint": endpoint}) + "\n")
        for i in range(config.actors):
            actor = ctx.Process(target=actor_main, name=f"embodyrl-actor-{i}",
                                args=(to_dict(config), endpoint, i, str(run_dir)),
                                kwargs={"keys": client_keys, "allow_insecure": allow_insecure})
            actor.start()
            processes.append(actor)
        while not parent_conn.poll(0.2):
            progress.show()
            if not learner.is_alive():
                raise TrainingError(f"learner exited with code {learner.exitcode}")
            failed = [p for p in processes[1:] if p.exitcode not in (None, 0)]
            if failed:
                raise TrainingError(f"{failed[0].name} exited with code {failed[0].exitcode}")
        _expect(parent_conn, learner, "done", 1.0)
        progress.show(force=True)
        learner.join(60)
        for actor in processes[1:]:
            actor.join(30)
    finally:
        progress.close()
        _stop(processes)


def _run_inline(config: TrainConfig, run_dir: Path, quiet: bool, progress: str) -> None:
    """The synchronous loop in this process (:mod:`embodyrl.learner.synchronous`), progress shown
    from its records."""
    from ..learner.synchronous import train_synchronous

    display = Display(run_dir / "metrics.jsonl", config.steps, "quiet" if quiet else progress,
                      title=f"embodyrl train --synchronous {config.task}")
    try:
        display.start()
        train_synchronous(config, run_dir, on_record=lambda record: display.show())
        display.show(force=True)
    finally:
        display.close()


def _expect(conn, process, kind: str, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.2):
        if not process.is_alive():
            raise TrainingError(f"{process.name} exited with code {process.exitcode} before '{kind}'")
        if time.monotonic() > deadline:
            raise TrainingError(f"{process.name} did not report '{kind}' within {timeout_s} s")
    got, payload = conn.recv()
    if got == "error":
        raise TrainingError(f"{process.name} failed:\n{payload}")
    if got != kind:
        raise TrainingError(f"{process.name} reported {got!r} where {kind!r} was expected")
    return payload


def _last_metrics(run_dir: Path) -> dict:
    return learner_records(run_dir)[-1]


def evaluate_run(config: TrainConfig, run_dir: Path) -> dict:
    """The saved policy and a uniform random policy on the same seeded episodes, per device kind;
    none where a person resets the robot (they evaluate with ``embodyrl eval``, which waits for them)."""
    from .evaluate import versus_random_run
    from .person import reset_mode

    if reset_mode(config) == "operator":
        return {"eval_skipped": f"a person resets this robot: embodyrl eval {run_dir} waits for them "
                                "between episodes"}
    return versus_random_run(config, run_dir)
