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
    config = default_config(args.task)
    changes = {k: v for k, v in {"steps": args.steps, "seed": args.seed, "actors": args.actors}.items()
               if v is not None}
    config = dataclasses.replace(config, **changes)
    run_dir = Path(args.run_dir or f"runs/{args.task}-{time.strftime('%Y%m%d-%H%M%S')}")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embodyrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a task with local learner and actor processes")
    t.add_argument("task", help="registered task name, e.g. pendulum")
    t.add_argument("--steps", type=int, help="environment steps, summed over all actors")
    t.add_argument("--run-dir", help="where the run directory goes (default runs/TASK-TIME)")
    t.add_argument("--seed", type=int)
    t.add_argument("--actors", type=int, help="number of actor processes")
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    t.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
