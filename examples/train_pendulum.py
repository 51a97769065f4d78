"""Train the pendulum swing-up in simulation through the Python API.

What ``embodyrl train pendulum`` does, as a script you can change: take the
task's tuned configuration, adjust it in code, run a learner process and
actor processes on this machine, then evaluate the saved policy::

    python examples/train_pendulum.py                    # the tuned 30k steps: minutes on 2 cores
    python examples/train_pendulum.py --actors 2 --algorithm ddpg
    python examples/train_pendulum.py --quick            # a smoke run of a few hundred steps

The run directory holds config.json, metrics.jsonl, TensorBoard events (tb/),
the replay, checkpoints and the saved policy (policy/); the other commands
read it: ``embodyrl eval RUN_DIR``, ``embodyrl plot RUN_DIR``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from embodyrl.cli.evaluate import evaluate_saved_run
from embodyrl.cli.launch import train
from embodyrl.config import default_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="default: runs/train_pendulum-TIME")
    parser.add_argument("--actors", type=int, default=1, help="actor processes")
    parser.add_argument("--algorithm", choices=("ddpg", "td3", "sac", "rlpd"),
                        help="default: the pendulum's tuned one (SAC)")
    parser.add_argument("--quick", action="store_true", help="600 steps with small networks (tests)")
    args = parser.parse_args(argv)

    # Typed, frozen configuration: the task's tuned values, changed with dataclasses.replace.
    config = default_config("pendulum")
    config = replace(config, actors=args.actors, algorithm=args.algorithm or config.algorithm)
    if args.quick:
        config = replace(config, steps=600, eval_episodes=2,
                         ddpg=replace(config.ddpg, hidden_sizes=(32, 32)),
                         sac=replace(config.sac, hidden_sizes=(32, 32)),
                         learner=replace(config.learner, min_replay=200),
                         actor=replace(config.actor, random_steps=200))

    run_dir = args.run_dir or Path(f"runs/train_pendulum-{time.strftime('%Y%m%d-%H%M%S')}")
    # A learner process and `actors` actor processes (spawned); progress lines on stderr.
    summary = train(config, run_dir, progress="plain")
    print(f"{summary['env_steps']} steps in {summary['wall_s']} s; "
          f"trained return {summary['eval_return_mean']:.1f} (random {summary['random_return_mean']:.1f}), "
          f"upright {summary['eval_upright_fraction']:.0%} of the time (random "
          f"{summary['random_upright_fraction']:.0%}), median angle {summary['eval_angle_error_median']:.3f} rad")

    # The saved policy runs again later from the directory alone: embodyrl eval does this.
    again = evaluate_saved_run(run_dir, episodes=1)
    print(f"one more episode from {run_dir}/policy: return {again['return_mean']:.1f}")


if __name__ == "__main__":
    main()
