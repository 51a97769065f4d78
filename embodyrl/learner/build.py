"""Assemble a learner service from a training config: its server, data side, training and sinks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..algos import registry
from ..algos.heads import over
from ..hal.console import dial_console
from ..hal.layout import Layout
from ..hal.steps import REWARD_BOUND, PolicyVersion, new_incarnation
from ..hal.wire.protocol import DeviceInfo
from ..hal.wire.security import ServerKeys
from ..policy import save_policy
from ..transport import LearnerServer
from ..transport.publisher import WeightsConfig
from ..transport.server import MAX_BATCH_ROWS, session_limits
from .checkpoint import Checkpointer, record_incarnation
from .devices import Placement, check_batch, resolve
from .hosts import OneHost
from .ingest import FrontServer, IngestWorkers, ingest_spec, port_of
from .metrics import MetricsLog
from .policy_graphs import PolicyGraphs
from .replay_side import ReplayData
from .rollout_side import RolloutData
from .service import LearnerService, Training
from .shards import ShardedReplay
from .snapshots import Snapshots


def make_learner(config, run_dir: Path, **kwargs) -> LearnerService:
    """The learner for ``config``'s task (its layout: one device kind, or several for ``a+b``; a
    robot's as ``config.json`` recorded it, so the learner never reaches the robot).
    ``kwargs``: ``keys`` and ``allow_insecure`` of :func:`build_learner`."""
    from ..robot import layout_of, reward_bounds_of

    return build_learner(config, layout_of(config), run_dir, reward_bounds=reward_bounds_of(config), **kwargs)


def build_learner(config, layout: Layout, run_dir: Path, *, keys: ServerKeys | None = None,
                  allow_insecure: bool = False, hosts=None,
                  reward_bounds: Sequence[float] | None = None) -> LearnerService:
    """The learner service of ``config`` for the device kinds of ``layout``, its files in ``run_dir``.

    ``keys``: CurveZMQ for the actors' link; without them only loopback unless ``allow_insecure``.
    The server admits a device only if it fits the layout; the data side stores rows in the
    layout's row layout (padded, with several kinds), and the algorithm acts over it.
    Demonstrations (``learner.demos``) are checked against the layout's specs and loaded into
    the replay here, before the update compiles; what the replay already holds is not loaded again.
    ``hosts``: this learner's place among several (:func:`embodyrl.learner.hosts.join`, called before
    anything touched JAX); each host's replay samples its share of every batch.
    ``reward_bounds``: each device kind's largest |reward| (:func:`embodyrl.robot.reward_bounds_of`;
    None: :data:`~embodyrl.hal.steps.REWARD_BOUND`); a row beyond it is refused. The new incarnation
    joins the run's list (:func:`~.checkpoint.record_incarnation`) before anything is served: rows
    acted under this run's earlier learners are taken, under any other incarnation refused.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lc = config.learner
    algorithm = over(config.algo, layout)
    observation_spec, action_spec = layout.observation_spec, layout.action_spec
    incarnation = new_incarnation()
    earlier = record_incarnation(run_dir, incarnation)
    bounds = tuple(reward_bounds) if reward_bounds else (REWARD_BOUND,) * len(layout.kinds)
    hosts = hosts or OneHost()
    placement = placement_of(config, hosts)
    if algorithm.on_policy:
        _refuse_replay_settings(algorithm.name, lc)
        if lc.ingest_workers:
            raise ValueError(f"learner.ingest_workers: {algorithm.name} learns on-policy from rollouts in the "
                             "learner's memory; ingest workers fill replay shards")
        if hosts.count > 1:
            raise ValueError(f"learner.hosts: {algorithm.name} learns on-policy from its own rollouts; "
                             "several hosts share a replay-based algorithm's batches")
        training = Training.of(algorithm, observation_spec, action_spec, config.seed, placement=placement,
                               updates_per_call=1, publish_every=1)  # one iteration, then publish
        data = RolloutData(algorithm.config, lc.credit_quantum, PolicyVersion(incarnation, 0),
                           observation_spec, action_spec)
        committed_seq = None
    elif lc.ingest_workers:
        _refuse_ingest_settings(algorithm.name, lc, hosts)
        workers = IngestWorkers(run_dir, lc.ingest_workers, ingest_spec(config), bind=lc.bind, keys=keys,
                                allow_insecure=allow_insecure, incarnation=incarnation, incarnations=earlier)
        training = Training.of(algorithm, observation_spec, action_spec, config.seed, placement=placement,
                               updates_per_call=lc.updates_per_call, publish_every=lc.publish_every)
        data = ShardedReplay(workers, lc, batch_size=algorithm.batch_size, batch_rows=config.actor.send_every,
                             beta_updates=int(config.steps * lc.updates_per_step))
        committed_seq = None
    else:
        training, data = off_policy_parts(config, layout, algorithm, run_dir, placement=placement, hosts=hosts)
        committed_seq = data.committed_seq
    max_batch_rows = max(MAX_BATCH_ROWS, 2 * (config.actor.send_every + 2))
    kinds = [DeviceInfo(i, k.name, k.observation_spec, k.action_spec) for i, k in enumerate(layout.kinds)]
    front = {"workers": data.workers} if isinstance(data, ShardedReplay) else {}
    server = (FrontServer if front else LearnerServer)(
        lc.bind, run_id=run_dir.name, incarnation=incarnation, admit=admission(layout),
        limits=session_limits(kinds, max_batch_rows), max_batch_rows=max_batch_rows,
        peer_timeout_s=lc.peer_timeout_s, keys=keys, allow_insecure=allow_insecure,
        weights=WeightsConfig(encoding=lc.weights_encoding), bindings_path=run_dir / "key_bindings.json",
        committed_seq=committed_seq, reward_bound=reward_bound_of(layout, bounds), incarnations=earlier, **front)
    if front:
        try:
            data.workers.start(port_of(server.endpoint))
        except BaseException:
            server.close()
            raise

    def save(version: PolicyVersion, weights, directory: Path = run_dir / "policy") -> None:
        save_policy(directory, version, weights, observation_spec, action_spec, algorithm)

    console = dial_console(config.console, role="learner", console_key=config.console_key,
                           own_secret_key=keys.secret_key_file if keys else None, allow_insecure=allow_insecure)
    service = LearnerService(
        server, data, training, console=console.start() if console else None,
        checkpointer=Checkpointer(run_dir / "checkpoints", own_process=hosts.index if hosts.count > 1 else None),
        metrics_sink=MetricsLog(run_dir), save_policy=save, budget=config.steps,
        batch_rows=config.actor.send_every, incarnation=incarnation,
        log_every_s=lc.log_every_s, checkpoint_every_s=lc.checkpoint_every_s,
        kinds=(layout.names, layout.kind_of), hosts=hosts,
        snapshots=Snapshots.of(config, run_dir, save))
    server.policy_graphs = PolicyGraphs(algorithm, layout, lambda: (service.version, training.actor_weights()))
    service.warm_up()
    return service


def off_policy_parts(config, layout: Layout, algorithm, run_dir: Path, *, placement: Placement,
                     hosts=None) -> tuple[Training, ReplayData]:
    """(training, replay data side) of an off-policy algorithm: the replay in ``run_dir/replay``,
    ``learner.demos`` loaded into it. The learner service and the synchronous loop
    (:mod:`.synchronous`) both train on these."""
    lc, hosts = config.learner, hosts or OneHost()
    training = Training.of(algorithm, layout.observation_spec, layout.action_spec, config.seed, placement=placement,
                           updates_per_call=lc.updates_per_call, publish_every=lc.publish_every)
    data = ReplayData(run_dir / "replay", layout.observation_spec, layout.action_spec, lc,
                      batch_size=algorithm.batch_size // hosts.count, discount=algorithm.discount,
                      seed=config.seed + 7919 * hosts.index, pad=layout.pad_steps,
                      beta_updates=int(config.steps * lc.updates_per_step))
    if lc.demos:
        try:
            data.load_demonstrations(lc.demos, [(k.name, k.observation_spec, k.action_spec)
                                                for k in layout.kinds], lc.demos_features)
        except BaseException:
            data.close(failed=False)
            raise
    return training, data


def placement_of(config, hosts) -> Placement:
    """Where ``config``'s update runs: ``learner.devices`` of each of ``hosts``; refused at start when
    the algorithm cannot split its update or its batch does not divide by the device count."""
    entry = registry.get(config.algorithm)
    batch_size = getattr(getattr(config, entry.section), entry.shard_by) if entry.shard_by else None
    placement = Placement(resolve(config.learner.devices), hosts=hosts.count, host_index=hosts.index,
                          batch_size=batch_size)
    if placement.count > 1:
        if entry.shard_by is None:
            raise ValueError(f"learner.devices: {entry.name} cannot split its update over several devices")
        check_batch(batch_size, placement.count, f"{entry.section}.{entry.shard_by}")
    return placement


def _refuse_ingest_settings(name: str, lc, hosts) -> None:
    """Ingest workers shard the replay by actor: a batch's sources and several hosts need one replay."""
    if hosts.count > 1:
        raise ValueError("learner.ingest_workers: with several learner hosts each host ingests its own actors; "
                         "use one or the other")
    for key, value in (("demos", lc.demos), ("mix", lc.mix)):
        if value:
            raise ValueError(f"learner.{key}: the replay's shards hold actors' rows; demonstrations and a mix "
                             "by source need one replay (learner.ingest_workers 0)")


def _refuse_replay_settings(name: str, lc) -> None:
    """An on-policy algorithm learns from its own rollouts: no replay to load, mix or prioritise."""
    for key, value in (("demos", lc.demos), ("mix", lc.mix), ("priority", lc.priority)):
        if value:
            raise ValueError(f"learner.{key}: {name} learns on-policy from its own rollouts, without a replay")


def reward_bound_of(layout: Layout, bounds: Sequence[float]):
    """The server's reward bound: device id -> its kind's bound."""
    def reward_bound(device_id: int) -> float:
        kind = layout.kind_of(device_id)
        return bounds[kind] if 0 <= kind < len(bounds) else REWARD_BOUND

    return reward_bound


def admission(layout: Layout):
    """The server's admission: every declared device must fit the layout."""
    def admit(devices: list[DeviceInfo]) -> str | None:
        for d in devices:
            reason = layout.refusal(d.device_id, d.name, d.observation_spec, d.action_spec)
            if reason is not None:
                return reason
        return None

    return admit
