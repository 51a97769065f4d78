"""The ``embodyrl`` command."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _train(args) -> int:
    import dataclasses

    from . import envs
    from .config import default_config
    from .train import TrainingError, train

    if args.task not in envs.names():
        print(f"embodyrl: unknown task {args.task!r}; known: {', '.join(envs.names())}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or f"runs/{args.task}-{time.strftime('%Y%m%d-%H%M%S')}")
    started = (run_dir / "config.json").exists()
    if args.resume and not started:
        print(f"embodyrl: --resume: {run_dir} holds no run to resume", file=sys.stderr)
        return 2
    if started and not args.resume:
        print(f"embodyrl: {run_dir} already holds a run; pass --resume to continue it", file=sys.stderr)
        return 2
    if args.resume:
        from .config import load

        config = load(run_dir / "config.json")
        if config.task != args.task:
            print(f"embodyrl: {run_dir} is a run of {config.task!r}, not {args.task!r}", file=sys.stderr)
            return 2
    else:
        config = default_config(args.task)
    changes = {k: v for k, v in {"steps": args.steps, "seed": args.seed, "actors": args.actors,
                                 "algorithm": args.algorithm}.items() if v is not None}
    config = dataclasses.replace(config, **changes)
    try:
        summary = train(config, run_dir, quiet=args.quiet)
    except KeyboardInterrupt:
        print("embodyrl: interrupted; every process stopped", file=sys.stderr)
        return 130
    except TrainingError as err:
        print(f"embodyrl: training failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    print(f"run directory: {run_dir}", file=sys.stderr)
    return 0


def _bench(args) -> int:
    from . import bench

    try:
        result = bench.run(args.name, quick=args.quick)
    except KeyError as err:
        print(f"embodyrl: {err.args[0]}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        width = max(len(k) for k in result)
        for key, value in result.items():
            print(f"{key:<{width}}  {value}")
    return 0


def _keys(args) -> int:
    from .hal.wire.security import generate_keys

    public, secret = generate_keys(args.directory, args.name)
    print(f"public key (share it): {public}\nsecret key (keep it):  {secret}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embodyrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a task with local learner and actor processes")
    t.add_argument("task", help="registered task name, e.g. pendulum")
    t.add_argument("--steps", type=int, help="environment steps, summed over all actors")
    t.add_argument("--run-dir", help="where the run directory goes (default runs/TASK-TIME)")
    t.add_argument("--seed", type=int)
    t.add_argument("--actors", type=int, help="number of actor processes")
    t.add_argument("--algorithm", choices=("ddpg", "td3", "sac", "rlpd"), help="off-policy algorithm (default ddpg)")
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in --run-dir: its checkpoint, its replay, its actors' spools")
    t.set_defaults(func=_train)
    b = sub.add_parser("bench", help="run a shipped benchmark against its baseline")
    b.add_argument("name", help="benchmark name (hal, replay, ...)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    b.set_defaults(func=_bench)
    k = sub.add_parser("keys", help="generate a CurveZMQ key pair for a learner or an actor")
    k.add_argument("directory", help="where to write NAME.key and NAME.key_secret")
    k.add_argument("name", help="who the keys are for, e.g. learner or robot-3")
    k.set_defaults(func=_keys)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
