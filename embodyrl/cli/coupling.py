"""``embodyrl learner coupling``: the coupled model's learner on its own, for a model in any language.

A Fortran or C model (``hal/coupling/c``) or a Python one (``CouplingLink``) is pointed at the
endpoint this prints. The configuration is a YAML file::

    coupling: {levels: 70, features: 3, context: 2, radius: 2, max_correction: 3.0}
    learner: {capacity: 200000, min_steps: 2000, publish_every: 100, seed: 0}
    training: {hidden_sizes: [64, 64], actor_lr: 0.001}

``coupling`` describes the ranks' columns (:class:`~embodyrl.hal.coupling.CouplingConfig`'s shape
fields), ``learner`` and ``training`` (the coupling learner's DDPG settings) the training (:class:`~embodyrl.coupling.CouplingLearnerConfig`).
The initial policy is written to ``RUN_DIR/policy_init`` (``.json``, ``.npz`` and the ``.msgpack``
a C rank reads) before the endpoint is printed, the last one to ``RUN_DIR/policy`` at the end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

SHAPE_FIELDS = ("levels", "features", "context", "radius", "max_correction")
LEARNER_FIELDS = ("capacity", "min_steps", "updates_per_call", "publish_every", "seed")


class CouplingConfigError(ValueError):
    """The YAML file names something the coupling learner does not have."""


def configs(text: dict, seed: int | None):
    """(CouplingConfig, CouplingLearnerConfig) from the YAML file's map."""
    from ..algos.ddpg import DDPGConfig
    from ..coupling import CouplingLearnerConfig
    from ..hal.coupling import CouplingConfig

    unknown = sorted(set(text) - {"coupling", "learner", "training"})
    if unknown:
        raise CouplingConfigError(f"unknown sections {unknown}; expected coupling, learner, training")
    shape, learner, training = (dict(text.get(k) or {}) for k in ("coupling", "learner", "training"))
    for name, given, known in (("coupling", shape, SHAPE_FIELDS), ("learner", learner, LEARNER_FIELDS),
                               ("training", training, tuple(f.name for f in dataclasses.fields(DDPGConfig)))):
        wrong = sorted(set(given) - set(known))
        if wrong:
            raise CouplingConfigError(f"{name}: unknown fields {wrong}; known: {list(known)}")
    if "levels" not in shape or "features" not in shape:
        raise CouplingConfigError("coupling: levels and features are required")
    if "hidden_sizes" in training:
        training["hidden_sizes"] = tuple(training["hidden_sizes"])
    if seed is not None:
        learner["seed"] = seed
    defaults = CouplingLearnerConfig()
    try:
        coupling = CouplingConfig(**shape)
        config = CouplingLearnerConfig(ddpg=dataclasses.replace(defaults.ddpg, **training), **learner)
    except (TypeError, ValueError) as err:
        raise CouplingConfigError(str(err)) from None
    return coupling, config


def run_learner(args) -> int:
    """The ``learner coupling`` command (exit codes as ``embodyrl learner``'s)."""
    import yaml

    from ..coupling import CouplingLearner
    from ..hal import runtime
    from .processes import stop_on_signals
    from .security import check_address, server_keys

    for option in ("resume", "demos", "rendezvous", "algorithm"):
        if getattr(args, option, None):
            raise CouplingConfigError(f"--{option} does not apply to the coupling learner")
    if args.config is None or not Path(args.config).is_file():
        raise CouplingConfigError(f"--config FILE.yaml is required (no file {args.config})")
    coupling, config = configs(yaml.safe_load(Path(args.config).read_text()) or {}, args.seed)
    bind = args.bind or "tcp://127.0.0.1:*"
    keys = server_keys(args)
    check_address(bind, keys, args.insecure, "--bind")
    run_dir = Path(args.run_dir or f"runs/coupling-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    should_stop = stop_on_signals()
    learner = CouplingLearner(coupling, config, bind, keys=keys, allow_insecure=args.insecure, metrics_dir=run_dir)
    learner.warm_up()
    runtime.save(run_dir / "policy_init", *learner.export(), packed=True)
    (run_dir / "learner.json").write_text(json.dumps({"endpoint": learner.endpoint}) + "\n")
    print(json.dumps({"endpoint": learner.endpoint, "run_dir": str(run_dir),
                      "policy": str(run_dir / "policy_init.msgpack")}), flush=True)
    try:
        learner.run(math.inf, stop=lambda: should_stop() or (args.steps is not None and learner.size >= args.steps))
    finally:
        learner.publish()
        runtime.save(run_dir / "policy", *learner.export(), packed=True)
        counters = {"updates": learner.updates, "published": learner.published, "column_steps": learner.size,
                    "steps_by_rank": {str(k): v for k, v in sorted(learner.steps_by_rank.items())}}
        learner.close()
    print(json.dumps(counters), flush=True)
    return 130 if should_stop() else 0
