"""Typed configuration of a training run, saved verbatim into its run directory."""

from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from .algos import registry
from .hal.actor import ActorConfig
from .transport.publisher import MODES as WEIGHT_ENCODINGS

MIX_SOURCES = ("online", "demonstration", "intervention")
"""The keys of ``learner.mix``: :class:`~embodyrl.hal.steps.Source` names, lower case."""


@dataclass(frozen=True)
class LearnerConfig:
    """The learner's settings. Every size is in steps: the replay stores one row per environment
    step, plus one row per episode for its final observation."""

    replay_capacity: int = 1_000_000
    """Steps kept in replay (a ring: the oldest go first; demonstrations are never evicted)."""
    min_replay: int = 1000
    """Steps from actors in replay before the first gradient step (loaded demonstrations do not count)."""
    updates_per_step: float = 1.0
    """Gradient steps per step inserted: the update-to-data ratio, held by credits."""
    rate_tolerance: int = 1024
    """Steps the inserts may run ahead of the ratio before actors wait for credit."""
    credit_quantum: int = 256
    """Steps granted to an actor at a time (one credit is one step)."""
    updates_per_call: int = 16
    """Gradient steps fused into one jitted ``lax.scan`` call."""
    publish_every: int = 32
    """Gradient steps between weight publications."""
    weights_encoding: str = "auto"
    """How published weights travel: ``auto`` (full or a lossless delta, whichever is smaller by
    the measured density), or pinned ``full``, ``delta``, ``bf16`` (half the bytes) or ``int8``
    (a quarter; both lossy). Adam moves nearly every weight every step, so ``auto`` mostly sends
    full weights; on a thin link pin ``bf16`` or ``int8``, or publish less often."""
    log_every_s: float = 1.0
    bind: str = "tcp://127.0.0.1:*"
    """Where the learner listens; actors dial it."""
    peer_timeout_s: float = 30.0
    replay_chunk_rows: int = 4096
    """Steps per replay chunk: the unit of eviction and cache policy (capacity rounds up to whole chunks)."""
    replay_ram_budget_mb: int = 1024
    """Page cache the replay keeps of its own data: recent and retained chunks first."""
    replay_commit_interval_s: float = 0.005
    """Longest wait for a group commit; actors are acked only once their rows are committed."""
    n_step: int = 1
    """Steps per return in sampled transitions (bootstraps through truncation, not termination)."""
    prefetch_batches: int = 2
    """Training calls' worth of batches sampled ahead in a background thread (0: sample inline)."""
    checkpoint_every_s: float = 60.0
    """Seconds between Orbax checkpoints of the learner state (one is also written on shutdown)."""
    demos: tuple[str, ...] = ()
    """Directories of demonstration files (:mod:`embodyrl.hal.demos`, ``*.npz``) or LeRobotDataset
    directories (:mod:`embodyrl.hal.lerobot_demos`), loaded into the replay at start as
    ``source=DEMONSTRATION``: each file or dataset once, by content hash, however often the run
    resumes; one whose specs differ from the task's is refused, naming the field."""
    demos_features: dict[str, str] | None = None
    """Observation field -> LeRobot feature, where a LeRobotDataset in ``demos`` names a field otherwise
    than ``observation.state``, ``observation.images.FIELD`` or ``observation.FIELD`` (a robot file's
    ``dataset_features``)."""
    mix: dict[str, float] | None = None
    """Fractions of every batch by source, e.g. ``{demonstration: 0.5, online: 0.5}``; keys are
    ``online``, ``demonstration`` (interventions included, unless ``intervention`` has its own
    fraction) and ``intervention``. Until a side holds its share of a batch it is left out (with
    none left: uniform), logged once and shown as ``mix_fallback``. None: uniform over all steps
    (``rlpd`` defaults to 50/50 demonstrations and online)."""
    priority: bool = False
    """Prioritised replay (Schaul et al. 2016): rows drawn in proportion to abs(TD error)^alpha
    (new rows at the largest priority so far), importance weights in the critic's loss."""
    priority_alpha: float = 0.6
    """How strongly priorities skew the draw (0: uniform)."""
    priority_beta: float = 0.4
    """The importance weights' exponent at the start, annealed linearly to 1 over the run's
    planned gradient steps (``steps * updates_per_step``)."""
    devices: int | str = 1
    """Accelerators of this host the update runs on: a count (the first N) or ``all``. With more than
    one, each update's batch is split over them and the state replicated (the same updates, faster
    when the batch is large): the batch must divide by the device count over every host."""
    ingest_workers: int = 0
    """Processes of this host that take the actors' steps, each on a port and a replay shard of its own
    (actor index modulo the count picks them), while this one trains (0: it ingests too). For many
    simulators: one process's intake is one core's (docs/scaling.md)."""
    hosts: int = 1
    """Learner processes, one per host, training one model with ``jax.distributed``; each serves its
    own actors from its own replay and brings its share of every batch (docs/scaling.md)."""
    host_index: int = 0
    """This learner's place among ``hosts`` (0 runs the coordinator)."""
    coordinator: str = ""
    """``HOST:PORT`` of host 0's coordination service, the same on every host (with ``hosts`` > 1)."""

    def __post_init__(self):
        if self.rate_tolerance < 2 * self.credit_quantum:
            raise ValueError("learner.rate_tolerance must be at least 2 * learner.credit_quantum")
        if self.updates_per_step <= 0:
            raise ValueError("learner.updates_per_step must be positive")
        if self.n_step < 1:
            raise ValueError("learner.n_step must be at least 1")
        if self.ingest_workers < 0:
            raise ValueError("learner.ingest_workers must be 0 or more")
        if self.weights_encoding not in WEIGHT_ENCODINGS:
            raise ValueError(f"learner.weights_encoding must be one of {WEIGHT_ENCODINGS}, not {self.weights_encoding!r}")
        if self.replay_chunk_rows < 2 or self.prefetch_batches < 0:
            raise ValueError("learner.replay_chunk_rows must be at least 2 and prefetch_batches non-negative")
        if isinstance(self.demos, str):
            object.__setattr__(self, "demos", (self.demos,))
        if self.mix is not None:
            object.__setattr__(self, "mix", _checked_mix(self.mix))
        if self.priority_alpha < 0 or not 0 <= self.priority_beta <= 1:
            raise ValueError("learner.priority_alpha must be non-negative and priority_beta in [0, 1]")
        if not (self.devices == "all" or (type(self.devices) is int and self.devices >= 1)):
            raise ValueError(f"learner.devices: expected a positive count or 'all', got {self.devices!r}")
        if self.hosts < 1 or not 0 <= self.host_index < self.hosts:
            raise ValueError(f"learner.host_index must be in [0, learner.hosts): {self.host_index} of {self.hosts}")
        if self.hosts > 1 and not self.coordinator:
            raise ValueError("learner.coordinator: several hosts need host 0's HOST:PORT")


def _checked_mix(mix) -> dict[str, float]:
    if not isinstance(mix, dict) or not mix:
        raise ValueError(f"learner.mix: expected a mapping of sources to fractions, got {mix!r}")
    for key, value in mix.items():
        if key not in MIX_SOURCES:
            raise ValueError(f"learner.mix.{key}: not a source; known: {', '.join(MIX_SOURCES)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"learner.mix.{key}: expected a non-negative fraction, got {value!r}")
    if sum(mix.values()) <= 0:
        raise ValueError(f"learner.mix: the fractions sum to 0 ({mix})")
    return {key: float(value) for key, value in mix.items()}


@dataclass(frozen=True)
class _Run:
    """What every run names before its sections (config.json's key order follows the fields)."""

    task: str = "pendulum"
    """A task name, ``gym:ID``, ``module:factory`` or a robot file (:func:`embodyrl.robot.load`), or
    several joined by ``+`` for one policy over devices of different shapes."""
    steps: int = 20_000
    """Environment steps, summed over all actors."""
    seed: int = 0
    actors: int = 1
    eval_episodes: int = 10
    eval_every: int = 0
    """Environment steps between policy snapshots (``snapshots/``), each evaluated like the final
    policy once the run ends (``eval.jsonl``, and ``evals`` in ``summary.json``): a learning curve
    of deterministic returns on fixed episodes. 0: the final policy only."""
    synchronous: bool = False
    """Train in one process, one environment step then its updates (``embodyrl train --synchronous``,
    :mod:`embodyrl.learner.synchronous`): the reference the learner and actor processes are measured
    against. A synchronous run's config.json records the settings it ran with."""
    algorithm: str = registry.DEFAULT
    """A registered name (:func:`embodyrl.algos.registry.names`); its settings are its section's."""
    console: str = ""
    """The operator console's control endpoint (``embodyrl console``), dialled by the learner and
    every actor (``tcp://HOST:PORT``); empty: no console."""
    console_key: str = ""
    """The console's public key file (CurveZMQ); the learner and each actor present their own
    secret keys. Empty: plain TCP, loopback only unless insecure links are allowed."""
    robot: dict = field(default_factory=dict)
    """Where ``task`` came from when it is not a built-in task (:meth:`embodyrl.robot.Robot.record`):
    each robot file's absolute path, content hash and declaration, and the device kinds' specs.
    Written when the run starts; ``--resume``, ``eval`` and ``export`` rebuild the robot from it."""


def _check(config) -> None:
    if config.algorithm not in registry.names():
        raise ValueError(f"algorithm: unknown {config.algorithm!r}; known: {', '.join(registry.names())}")
    batch = config.actor.send_every + 2  # one device's batch and its episode's final row (the recorder's size)
    if config.learner.credit_quantum < batch and not config.algo.on_policy:
        raise ValueError(f"learner.credit_quantum ({config.learner.credit_quantum}) must hold one batch of "
                         f"actor.send_every ({config.actor.send_every}) rows and an episode's final row, at least "
                         f"{batch}: an actor needs that much credit to send, and is granted more only once it "
                         "holds less than a quantum")
    if config.eval_every < 0:
        raise ValueError(f"eval_every: must be 0 (off) or a positive number of steps, not {config.eval_every}")


TrainConfig = dataclasses.make_dataclass(
    "TrainConfig",
    [*((section, kind, field(default_factory=kind)) for section, kind in registry.sections().items()),
     ("learner", LearnerConfig, field(default_factory=LearnerConfig)),
     ("actor", ActorConfig, field(default_factory=ActorConfig))],
    bases=(_Run,), frozen=True,
    namespace={
        "__module__": __name__,
        "__doc__": "A training run's settings: the run, then one section per algorithm family in the "
                   "registry's order (" + ", ".join(registry.sections()) + "), then the learner's and "
                   "the actors'. Only the section of ``algorithm`` is read.",
        "__post_init__": _check,
        "algo": property(registry.configured, doc="The configured algorithm, resolved from the registry "
                                                  "with its section's settings (TD3's, RLPD's options applied)."),
    })


# Tuned per-task values, kept apart from the generic defaults above.
_PIXEL_ENCODER = {"image_fields": ["auto"], "pixels_only": True, "channels": [16, 16, 16], "strides": [2, 2, 2],
                  "feature_dim": 50, "augment_pad": 4}
"""DrQ's encoder sized for a CPU: three 3x3 convolutions of 16 channels, stride 2, on the camera alone."""

TASK_DEFAULTS: dict[str, dict] = {
    # SAC at gamma 0.99 (its own default): near the top a pole held theta off vertical costs
    # theta^2 / (1 - gamma), tiny beside the drop in value across the edge of the states that can
    # still be caught; at 0.98 the critic cannot resolve it and the policy settles up to 0.1 rad off
    # the top (DDPG and SAC alike). docs/benchmarks.md has the 10-seed table and the settings tried.
    "pendulum": {"steps": 30_000, "algorithm": "sac"},
    # the settings of the documented run that swings the pendulum up from stacked frames alone
    # (docs/benchmarks.md: eval -126, upright 1.0 at 50k steps; examples/configs/pixels_sac.yaml)
    "pendulum_pixels_stacked": {
        "steps": 50_000, "algorithm": "sac",
        "sac": {"discount": 0.98, "batch_size": 64, "actor_lr": 1e-3, "critic_lr": 1e-3, "temperature_lr": 1e-3,
                "init_temperature": 0.1, "tau": 0.01, "encoder": _PIXEL_ENCODER},
        "ddpg": {"discount": 0.98, "batch_size": 64, "encoder": _PIXEL_ENCODER},
        "learner": {"updates_per_step": 1.0, "updates_per_call": 4, "replay_capacity": 51_200},
        "actor": {"credit_timeout_s": 3600.0}},
    # one frame plus the joint state: the encoder reads the camera beside the state fields
    "pendulum_pixels": {
        "steps": 30_000, "algorithm": "sac",
        "sac": {"discount": 0.98, "batch_size": 64, "encoder": {**_PIXEL_ENCODER, "pixels_only": False}},
        "ddpg": {"discount": 0.98, "batch_size": 64, "encoder": {**_PIXEL_ENCODER, "pixels_only": False}},
        "learner": {"updates_per_call": 4, "replay_capacity": 51_200}},
    # CrossQ with its critics 256 wide, the settings that reach at 50k steps more than SAC at 100k
    # (docs/benchmarks.md, "CrossQ beside SBX's CrossQ and SAC"); the paper's 2048 are for a GPU
    "gym:HalfCheetah-v5": {
        "steps": 50_000, "algorithm": "crossq", "crossq": {"critic_hidden_sizes": [256, 256]},
        "actor": {"random_steps": 5_000}, "learner": {"min_replay": 5_000}},
}


def default_config(task: str) -> TrainConfig:
    """The generic defaults with ``task``'s tuned values applied, then its algorithm's implied ones."""
    data = to_dict(TrainConfig(task=task))
    tuned = TASK_DEFAULTS.get(task, {})
    _merge(data, copy.deepcopy(tuned))
    return from_dict(TrainConfig, apply_algorithm_defaults(data, tuned))


def apply_algorithm_defaults(data: dict, explicit: dict | None = None) -> dict:
    """``data`` (a config as a dict) with what its algorithm implies outside its section (the registry
    entry's ``defaults``: PPO's actors take no random warm-up) on every key ``explicit`` leaves unset.

    Applied once, where a config is built, so config.json records what the run does.
    """
    if data.get("algorithm") in registry.names():  # an unknown one is refused, by name, when built
        _fill(data, registry.get(data["algorithm"]).defaults, explicit or {}, TrainConfig)
    return data


def _fill(into: dict, changes, explicit: dict, cls) -> None:
    """Set ``changes`` into ``into`` where ``explicit`` does not; sections of ``cls`` are filled
    key by key, any other value (a mapping such as ``learner.mix`` included) as a whole."""
    hints = typing.get_type_hints(cls)
    for key, value in changes.items():
        section = hints.get(key)
        if dataclasses.is_dataclass(section) and isinstance(into.get(key), dict):
            _fill(into[key], value, explicit.get(key) if isinstance(explicit.get(key), dict) else {}, section)
        elif key not in explicit:
            into[key] = copy.deepcopy(value)


def _merge(into: dict, changes: dict) -> None:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def to_dict(config) -> dict:
    return dataclasses.asdict(config)


def from_dict(cls, data: dict):
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types name the key."""
    return _build(cls, data, prefix="")


def _build(cls, data, prefix):
    if not isinstance(data, dict):
        raise ValueError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown config key {prefix}{unknown[0]}; known: {', '.join(sorted(known))}")
    values = {}
    for name, value in data.items():
        hint = hints[name]
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, value, key + ".")
        else:
            values[name] = _coerce(hint, value, key)
    return cls(**values)


def _coerce(hint, value, key):
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}: expected a list, got {value!r}")
        (item, *_rest) = typing.get_args(hint)
        return tuple(_coerce(item, v, key) for v in value)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        for member in members[:-1]:  # the first member the value fits (int | str: 2 stays a count)
            try:
                return _coerce(member, value, key)
            except ValueError:
                pass
        hint = members[-1]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and (type(value) is not hint):
        raise ValueError(f"{key}: expected {hint.__name__}, got {value!r}")
    return value


def save(config: TrainConfig, path: Path) -> None:
    path.write_text(json.dumps(to_dict(config), indent=2) + "\n")


def load(path: Path) -> TrainConfig:
    """A saved run's config (``config.json``); a key it predates reads as the behaviour it ran with
    (its section's ``past_defaults``), so it resumes, evaluates and exports as it trained."""
    data = json.loads(Path(path).read_text())
    for section, settings in registry.sections().items():
        if isinstance(data.get(section), dict):
            for key, then in getattr(settings, "past_defaults", {}).items():
                data[section].setdefault(key, then)
    return from_dict(TrainConfig, data)


# -- loading from YAML and the command line ----------------------------------------

def load_yaml(path: Path) -> dict:
    """The mapping in a YAML config file (pyyaml's safe loader: plain data only)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    return data


def parse_override(key: str, raw: str) -> dict:
    """``("ddpg.actor_lr", "3e-4")`` -> ``{"ddpg": {"actor_lr": 0.0003}}``, typed by the field."""
    cls, parts = TrainConfig, key.split(".")
    for depth, part in enumerate(parts):
        fields = {f.name for f in dataclasses.fields(cls)}
        if part not in fields:
            where = ".".join(parts[:depth]) or "config"
            raise ValueError(f"unknown config key {key}: {where} has no {part!r}; "
                             f"known: {', '.join(sorted(fields))}")
        hint = typing.get_type_hints(cls)[part]
        if depth < len(parts) - 1:
            if not dataclasses.is_dataclass(hint):
                raise ValueError(f"unknown config key {key}: {'.'.join(parts[:depth + 1])} is not a section")
            cls = hint
        elif dataclasses.is_dataclass(hint):
            raise ValueError(f"config key {key} is a section; set one of its fields, e.g. --{key}.FIELD")
    value: object = _parse_value(hint, raw, key)
    for part in reversed(parts):
        value = {part: value}
    return value


def _parse_value(hint, raw: str, key: str):
    """Text from the command line as the field's type; a bad value names the key."""
    import yaml

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if raw.lower() in ("none", "null", "~") and type(None) in typing.get_args(hint):
            return None
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        for member in members[:-1]:  # the first member the text parses as (int | str: "2" is a count)
            try:
                return _parse_value(member, raw, key)
            except ValueError:
                pass
        hint = members[-1]
        origin = typing.get_origin(hint)
    try:
        if hint is str:
            return raw
        if hint is bool:
            lowered = raw.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return lowered in ("true", "1", "yes")
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
        if origin is tuple:
            value = yaml.safe_load(raw)
            return list(value) if isinstance(value, (list, tuple)) else value
    except ValueError:
        name = getattr(hint, "__name__", str(hint))
        raise ValueError(f"{key}: expected {name}, got {raw!r}") from None
    return yaml.safe_load(raw)


def build_config(base: TrainConfig, yaml_path: Path | None = None,
                 overrides: list[tuple[str, str]] = ()) -> TrainConfig:
    """``base`` with the YAML file merged over it, then the dotted overrides, then what the algorithm
    implies for every key neither set (:func:`apply_algorithm_defaults`), validated."""
    return build_given(base, yaml_path, overrides)[0]


def build_given(base: TrainConfig, yaml_path: Path | None = None,
                overrides: list[tuple[str, str]] = ()) -> tuple[TrainConfig, dict]:
    """:func:`build_config`, and what the YAML file and the overrides set: a mapping shaped as a
    config of the keys the user gave, whatever their values (a default given is given)."""
    data, explicit = to_dict(base), {}
    changes = []
    if yaml_path is not None:
        loaded = load_yaml(yaml_path)
        if "task" in loaded and loaded["task"] != base.task:
            raise ValueError(f"task: {yaml_path} is for {loaded['task']!r}, not {base.task!r}")
        changes.append(loaded)
    changes += [parse_override(key, raw) for key, raw in overrides]
    for change in changes:
        _merge(data, copy.deepcopy(change))
        _merge(explicit, copy.deepcopy(change))
    return from_dict(TrainConfig, apply_algorithm_defaults(data, explicit)), explicit


def warm_up_refusal(config: TrainConfig, *given: dict) -> str | None:
    """Why ``config``'s budget ends before it learns anything, unless the user set the warm-up
    (``given``: mappings of the keys set, as :func:`build_given` returns them, a robot file's
    :meth:`~embodyrl.robot.Robot.config_defaults`); None when it does not.

    ``steps`` counts the actors' steps only (loaded demonstrations are not in it), and so do both
    warm-ups. Each actor acts uniformly at random for its first ``actor.random_steps``: with
    ``steps <= actors * random_steps`` no step of the run is acted by a learned policy. An
    off-policy learner's first update waits until the replay holds ``learner.min_replay`` steps
    from actors, and the run ends once it has taken ``steps``: with ``steps <= min_replay`` no
    update happens at all. PPO keeps no replay (its ``min_replay`` is never read) and takes no
    random warm-up unless set.
    """
    random_steps, min_replay = config.actor.random_steps, config.learner.min_replay
    def unset(section: str, key: str) -> bool:
        return not any(key in (mapping.get(section) or {}) for mapping in given)

    all_random = config.steps <= config.actors * random_steps and unset("actor", "random_steps")
    no_update = (not config.algo.on_policy and config.steps <= min_replay and unset("learner", "min_replay"))
    if not (all_random or no_update):
        return None
    why = []
    if no_update:
        why.append(f"updates start once the replay holds learner.min_replay = {min_replay} steps from "
                   "actors, so no update would happen")
    if all_random:
        actors = f"each of {config.actors} actors" if config.actors > 1 else "the actor"
        why.append(f"{actors} acts at random for its first actor.random_steps = {random_steps} steps, "
                   "so no step would be acted by a learned policy")
    quarter = max(1, config.steps // 4)
    return (f"--steps {config.steps} ends within the warm-up: " + "; ".join(why) + ". Set both below "
            f"the budget, e.g. --actor.random_steps {max(1, quarter // config.actors)} --learner.min_replay "
            f"{quarter} (or in the --config file); values given explicitly run as set (docs/robots.md#warm-up)")
