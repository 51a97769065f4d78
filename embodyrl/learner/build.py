"""Assemble a learner service from a training config: its server, data side, training and sinks."""

from __future__ import annotations

from pathlib import Path

from ..checkpoint import Checkpointer
from ..hal.specs import ArraySpec, DictSpec
from ..hal.steps import PolicyVersion, new_incarnation
from ..hal.wire.protocol import DeviceInfo
from ..hal.wire.security import ServerKeys
from ..policy import save_policy
from ..transport import LearnerServer
from .metrics import MetricsLog
from .replay_side import ReplayData
from .rollout_side import RolloutData
from .service import LearnerService, Training


def make_learner(config, run_dir: Path, **kwargs) -> LearnerService:
    """The learner for ``config``'s task: one device kind, or several (``a+b``, a heterogeneous layout).
    ``kwargs``: ``keys`` and ``allow_insecure`` of :func:`build_learner`."""
    from .. import envs, hetero

    if hetero.is_hetero(config.task):
        layout = hetero.layout(config.task)
        return build_learner(config, layout.observation_spec, layout.action_spec, run_dir, layout=layout, **kwargs)
    device, _ = envs.make(config.task)
    return build_learner(config, device.observation_spec, device.action_spec, run_dir, **kwargs)


def build_learner(config, observation_spec: DictSpec, action_spec: ArraySpec, run_dir: Path, *,
                  keys: ServerKeys | None = None, allow_insecure: bool = False, layout=None) -> LearnerService:
    """The learner service of ``config`` for devices of these specs, its files in ``run_dir``.

    ``keys``: CurveZMQ for the actors' link; without them only loopback unless ``allow_insecure``.
    ``layout``: a :class:`~embodyrl.algos.heads.HeteroLayout` to train one policy over devices of
    different shapes (its padded specs are ``observation_spec`` and ``action_spec``).
    """
    from ..algos.heads import hetero

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lc = config.learner
    algorithm = hetero(config.algo, layout) if layout is not None else config.algo
    incarnation = new_incarnation()
    if algorithm.on_policy:
        training = Training.of(algorithm, observation_spec, action_spec, config.seed,
                               updates_per_call=1, publish_every=1)  # one iteration, then publish
        data = RolloutData(algorithm.config, lc.credit_quantum, PolicyVersion(incarnation, 0),
                           observation_spec, action_spec)
        committed_seq = None
    else:
        training = Training.of(algorithm, observation_spec, action_spec, config.seed,
                               updates_per_call=lc.updates_per_call, publish_every=lc.publish_every)
        data = ReplayData(run_dir / "replay", observation_spec, action_spec, lc, batch_size=algorithm.batch_size,
                          discount=algorithm.discount, seed=config.seed,
                          pad=layout.pad_steps if layout is not None else None)
        committed_seq = data.committed_seq
    admit = _fits_layout(layout) if layout is not None else _same_specs(observation_spec, action_spec)
    server = LearnerServer(lc.bind, run_id=run_dir.name, incarnation=incarnation, admit=admit,
                           peer_timeout_s=lc.peer_timeout_s, keys=keys, allow_insecure=allow_insecure,
                           committed_seq=committed_seq)

    def save(version: PolicyVersion, weights) -> None:
        save_policy(run_dir / "policy", version, weights, observation_spec, action_spec, algorithm)

    service = LearnerService(
        server, data, training, checkpointer=Checkpointer(run_dir / "checkpoints"),
        metrics_sink=MetricsLog(run_dir), save_policy=save, budget=config.steps, incarnation=incarnation,
        log_every_s=lc.log_every_s, checkpoint_every_s=lc.checkpoint_every_s,
        device_names=tuple(kind.name for kind in layout.kinds) if layout is not None else ())
    service.warm_up()
    return service


def _same_specs(observation_spec: DictSpec, action_spec: ArraySpec):
    def admit(devices: list[DeviceInfo]) -> str | None:
        for d in devices:
            if d.observation_spec != observation_spec or d.action_spec != action_spec:
                return f"device {d.name!r} has specs that differ from this learner's task"
        return None

    return admit


def _fits_layout(layout):
    def admit(devices: list[DeviceInfo]) -> str | None:
        for d in devices:  # each device id has its declared kind
            reason = layout.refusal(d.device_id, d.name, d.observation_spec, d.action_spec)
            if reason is not None:
                return reason
        return None

    return admit
