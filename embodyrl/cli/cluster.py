"""``embodyrl launch BACKEND TASK``: the same run placed by an engine (docs/scaling.md).

``local`` is ``embodyrl train``; ``ray`` makes the learner and the actors Ray actors, ``slurm``
writes and submits sbatch jobs; they find each other through the run's rendezvous record
(:mod:`embodyrl.cluster`).
"""

from __future__ import annotations

import argparse
import json
import sys

BACKENDS = ("local", "ray", "slurm")


def register_launch(sub, add_run_arguments) -> None:
    p = sub.add_parser(
        "launch", help="train TASK with the learner and actors placed by local processes, Ray or Slurm",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train TASK as `train` does, the processes placed by BACKEND: local (this machine, "
                    "as train), ray (Ray actors, restarted when they die; a local cluster unless "
                    "--address) or slurm (sbatch jobs, requeued when they die). The learner and actors find each other through the run's rendezvous "
                    "record, every actor with its own CurveZMQ key pair.",
        epilog="overrides: any config field as --SECTION.FIELD VALUE, as for train\n"
               "exit codes: 0 done, 1 training failed (or sbatch refused), 2 bad arguments or config (or Ray missing)")
    p.add_argument("backend", choices=BACKENDS, help="local: processes on this machine (as train); ray: Ray actors; slurm: sbatch jobs")
    add_run_arguments(p)
    ray = p.add_argument_group("ray")
    ray.add_argument("--address", help="join this Ray cluster (default: start one on this machine)")
    ray.add_argument("--learner-resources", type=_resource_map, metavar="JSON",
                     help='what the learner asks for, e.g. \'{"GPU": 1}\'')
    ray.add_argument("--actor-resources", type=_resource_maps, metavar="JSON",
                     help='what each actor asks for: one map for all, or a list of maps (one per actor, '
                          'e.g. \'[{"robot-1": 1}, {"robot-2": 1}]\': a robot is a custom resource of the '
                          'PC beside it); default: actors spread over the nodes')
    ray.add_argument("--shared-fs", action="store_true",
                     help="the run directory is on a filesystem every node shares: the learner may run on "
                          "any node (else it stays on this one, beside its replay)")
    p.add_argument("--key-dir", help="where each node keeps its actors' key pairs (node-local; default "
                                     "~/.cache/embodyrl/keys with ray, /tmp/embodyrl-keys with slurm)")
    ray.add_argument("--host", default=None,
                     help="the address actors dial; default: each learner node's own address "
                          "(127.0.0.1 for a cluster of this machine alone)")
    slurm = p.add_argument_group("slurm (the run directory on a filesystem every node shares)")
    slurm.add_argument("--dry-run", action="store_true", help="write RUN_DIR/slurm/*.sbatch without submitting")
    slurm.add_argument("--wait", action="store_true",
                       help="wait for the learner's job, then stop the actors' and write summary.json")
    slurm.add_argument("--partition", help="both jobs' partition")
    slurm.add_argument("--time", dest="time_limit", metavar="HH:MM:SS", help="both jobs' time limit")
    slurm.add_argument("--gpus", type=int, default=0, help="GPUs of the learner's job (default 0)")
    slurm.add_argument("--sbatch", action="append", default=[], metavar="LINE",
                       help="another #SBATCH line for both jobs, e.g. --sbatch=--account=proj (repeatable)")
    slurm.add_argument("--coupled-command", metavar="CMD",
                       help="a coupled MPI model started with srun in each actor's allocation")
    slurm.add_argument("--coupled-ranks", type=int, default=1, help="its MPI ranks (default 1)")
    p.set_defaults(func=_launch)


def _resource_map(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict) or not all(isinstance(v, (int, float)) for v in value.values()):
        raise argparse.ArgumentTypeError(f"expected a JSON map of resource -> amount, got {text!r}")
    return value


def _resource_maps(text: str) -> list[dict]:
    value = json.loads(text)
    maps = value if isinstance(value, list) else [value]
    for item in maps:
        _resource_map(json.dumps(item))
    return maps


def _launch(args) -> int:
    from .commands import _demos, _keep_yaml, _resolve_config, _run_dir, _train

    if args.backend == "local":
        return _train(args)
    if args.backend == "ray":  # before anything is written: without the extra, the command names it
        from ..cluster.ray_backend import import_ray

        import_ray()
    run_dir = _run_dir(args)
    config = _resolve_config(args, run_dir, {"actors": args.actors, "algorithm": args.algorithm, **_demos(args)})
    _keep_yaml(args, run_dir)
    if args.backend == "ray":
        from ..cluster.ray_backend import launch

        host = args.host if args.host is not None else (None if args.address else "127.0.0.1")
        summary = launch(config, run_dir, address=args.address, learner_resources=args.learner_resources,
                         actor_resources=args.actor_resources, shared_fs=args.shared_fs,
                         key_dir=args.key_dir or "~/.cache/embodyrl/keys", host=host)
    else:
        from ..cluster import slurm_backend

        options = slurm_backend.SlurmOptions(
            partition=args.partition, time_limit=args.time_limit, learner_gpus=args.gpus,
            key_dir=args.key_dir or "/tmp/embodyrl-keys", python=sys.executable, extra=tuple(args.sbatch),
            coupled_command=args.coupled_command, coupled_ranks=args.coupled_ranks if args.coupled_command else 0)
        try:
            summary = slurm_backend.launch(config, run_dir, options, dry_run=args.dry_run, wait=args.wait)
        except RuntimeError as err:
            print(f"embodyrl: launch slurm: {err}", file=sys.stderr)
            return 1
    print(json.dumps(summary, indent=2))
    print(f"run directory: {run_dir}", file=sys.stderr)
    return 0
