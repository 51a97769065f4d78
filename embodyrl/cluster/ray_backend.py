"""``embodyrl launch ray``: the learner and the actors as Ray actors, found through the record.

Ray places and restarts; the data goes over our own ZeroMQ link as always (credits, acks,
CurveZMQ). The learner is pinned to the node that holds its run directory (its replay is on that
node's disk) unless the run directory is on a shared filesystem; it asks for
``--learner-resources`` (``{"GPU": 1}``). Each actor asks for ``--actor-resources`` (a robot is a
custom resource, ``{"robot-1": 1}``, so its actor lands on the PC beside it), or the actors are
spread over the cluster's nodes. Both restart without limit: a killed actor process or a lost
node brings the actor back with its index, its key (on the same node) and its spool (under the
run directory), and it resends what the learner had not acknowledged; a restarted learner resumes
from its checkpoint on the same port, and the actors reconnect.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..config import TrainConfig, save, to_dict


def import_ray():
    """Ray, or ModuleNotFoundError for ``ray`` (the command line names the extra: :mod:`embodyrl.cli.extras`)."""
    import ray

    return ray


def _learner_role(ray):
    @ray.remote(max_restarts=-1, max_task_retries=-1)
    class LearnerRole:
        """The learner in a Ray worker: its record in Ray's store, its keys in the run directory."""

        def run(self, config_dict: dict, run_dir: str, host: str | None) -> dict:
            import dataclasses

            from ..cli.processes import stop_on_signals
            from ..config import from_dict
            from ..learner import make_learner
            from .rendezvous import RayRecord
            from .roles import KeySync, learner_bind, learner_keys, publish

            should_stop = stop_on_signals()
            run_dir = Path(run_dir)
            announce(run_dir, "learner")
            config = from_dict(TrainConfig, config_dict)
            record = RayRecord(run_dir.name, run_dir / "rendezvous" / "actors")
            config = dataclasses.replace(config, learner=dataclasses.replace(
                config.learner, bind=learner_bind(record, config.learner.bind)))
            sync = KeySync(record)
            try:
                learner = make_learner(config, run_dir, keys=learner_keys(run_dir, record))
                publish(record, learner, run_dir, host)
                counters = learner.run(should_stop)
            finally:
                sync.close()
            return dataclasses.asdict(counters)

    return LearnerRole


def _actor_role(ray):
    @ray.remote(max_restarts=-1, max_task_retries=-1)
    class ActorRole:
        """One actor in a Ray worker: its own key pair on its node, the learner from the record."""

        def run(self, config_dict: dict, run_id: str, index: int, run_dir: str, key_dir: str) -> None:
            from ..cli.processes import actor_main
            from .rendezvous import RayRecord
            from .roles import actor_keys

            announce(Path(run_dir), f"actor-{index}")
            record = RayRecord(run_id)
            entry, keys = actor_keys(record, index, Path(key_dir).expanduser(), 600.0)
            actor_main(config_dict, entry.endpoint, index, run_dir, keys=keys)

    return ActorRole


def announce(run_dir: Path, name: str) -> None:
    """Say which process plays ``name`` now (``RUN_DIR/processes/NAME.json``: pid, host, Ray node),
    rewritten by every restart: where to look, or what to kill, for one role of a run."""
    import os
    import socket

    import ray

    path = run_dir / "processes" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                               "node": ray.get_runtime_context().get_node_id()}) + "\n")
    os.replace(tmp, path)


class RayLaunch:
    """A run's learner and actors started on a Ray cluster (joined at ``address``, or a local one
    sized to this machine), the handles kept so a caller (or a test) can watch or kill them."""

    def __init__(self, config: TrainConfig, run_dir: Path, *, address: str | None = None,
                 learner_resources: dict | None = None, actor_resources: list[dict] | None = None,
                 shared_fs: bool = False, key_dir: str = "~/.cache/embodyrl/keys", host: str | None = "127.0.0.1",
                 num_cpus: int | None = None, object_store_mb: int = 256):
        ray = self.ray = import_ray()
        self.config, self.run_dir = config, Path(run_dir).absolute()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:  # a cluster of this machine alone, with a small object store (we send no objects)
                ray.init(num_cpus=num_cpus, object_store_memory=object_store_mb << 20, include_dashboard=False,
                         log_to_driver=False)
        self.config = config = _for_the_cluster(config, self.run_dir, host)
        save(config, self.run_dir / "config.json")
        learner_options = _resources(learner_resources or {})
        if not shared_fs:  # the replay is on this node's disk: the learner stays here
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            learner_options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False)
        self.learner = _learner_role(ray).options(**learner_options).remote()
        self.learner_result = self.learner.run.remote(to_dict(config), str(self.run_dir), host)
        role = _actor_role(ray)
        self.actors = []
        maps = actor_resources or [{}]  # one map for every actor, or one each
        for index in range(config.actors):
            wanted = maps[index % len(maps)]
            options = _resources(wanted) if wanted else {"scheduling_strategy": "SPREAD"}
            actor = role.options(**options).remote()
            actor.run.remote(to_dict(config), self.run_dir.name, index, str(self.run_dir), key_dir)
            self.actors.append(actor)

    def wait(self, timeout_s: float | None = None) -> dict:
        """The learner's counters once its budget is reached; then every actor is stopped."""
        try:
            return self.ray.get(self.learner_result, timeout=timeout_s)
        finally:
            self.stop()

    def stop(self) -> None:
        for actor in [*self.actors, self.learner]:
            self.ray.kill(actor, no_restart=True)


def _for_the_cluster(config: TrainConfig, run_dir: Path, host: str | None) -> TrainConfig:
    """Spools beside the run; with ``host`` None the learner listens on every interface and
    advertises its node's address, with a host given it listens there (``127.0.0.1``: a cluster
    of one machine)."""
    import dataclasses

    from .roles import with_spools

    config = with_spools(config, run_dir)
    return dataclasses.replace(config, learner=dataclasses.replace(config.learner, bind=f"tcp://{host or '0.0.0.0'}:*"))


def _resources(wanted: dict) -> dict:
    """Ray's actor options for a resource map: CPU and GPU as counts, the rest custom."""
    wanted = dict(wanted)
    options = {"num_cpus": wanted.pop("CPU", 1), "num_gpus": wanted.pop("GPU", 0)}
    if wanted:
        options["resources"] = wanted
    return options


def launch(config: TrainConfig, run_dir: Path, **kwargs) -> dict:
    """Run ``config`` on Ray into ``run_dir``; write and return ``summary.json`` (as ``train``)."""
    from ..cli.launch import evaluate_run
    from ..runlog import learner_records

    started = time.monotonic()
    run = RayLaunch(config, run_dir, **kwargs)
    counters = run.wait()
    summary = {"env_steps": learner_records(run.run_dir)[-1]["env_steps"], "updates": counters["updates"],
               "wall_s": round(time.monotonic() - started, 1), "backend": "ray"}
    summary.update(evaluate_run(run.config, run.run_dir))
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
