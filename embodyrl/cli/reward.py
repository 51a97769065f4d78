"""``embodyrl reward train``: a success classifier of camera frames, from demonstrations.

``embodyrl reward train DEMOS... --out DIR`` labels every frame of the
demonstrations (:mod:`embodyrl.reward.dataset`: the last k frames of a
successful episode positive, every other frame negative), holds out a
share of the episodes, trains the CNN (:mod:`embodyrl.reward.train`),
measures precision and recall on the held-out episodes, and writes
``DIR/classifier.json`` + ``DIR/classifier.npz`` (the numpy runtime's
export, :mod:`embodyrl.hal.classifier`) and ``DIR/metrics.json``; stdout
gets the same figures as one JSON object. A robot file pays its verdict with
``task.reward: classifier:DIR``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

METRICS_FILE = "metrics.json"


class _Refused(Exception):
    """Bad input: the message goes to stderr, the exit code is 2."""


def _say(text: str) -> None:
    print(f"embodyrl reward train: {text}", file=sys.stderr, flush=True)


def _threshold(text: str) -> float | str:
    if text == "f1":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1) or f1, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1) or f1, got {text!r}")
    return value


def train(args) -> int:
    try:
        result = _train(args)
    except _Refused as err:
        _say(str(err))
        return 2
    print(json.dumps(result))
    return 0


def _train(args) -> dict:
    from ..hal.classifier import JSON_FILE
    from ..reward.dataset import DatasetError, load_frames, split_episodes

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise _Refused(f"--out {out}: not a directory")
    if (out / JSON_FILE).exists():
        raise _Refused(f"--out {out} holds a classifier already: choose another directory")
    for name, value, ok in (("--last-k", args.last_k, args.last_k >= 1),
                            ("--held-out", args.held_out, 0 <= args.held_out < 1),
                            ("--batch-size", args.batch_size, args.batch_size >= 2),
                            ("--lr", args.lr, args.lr > 0),
                            ("--steps", args.steps, args.steps is None or args.steps >= 1),
                            ("--epochs", args.epochs, args.epochs is None or args.epochs > 0)):
        if not ok:
            raise _Refused(f"{name}: {value} is out of range")
    try:
        frames = load_frames(args.demos, camera=args.camera, last_k=args.last_k)
    except DatasetError as err:
        raise _Refused(str(err)) from None
    if not frames.labels.any():
        raise _Refused(f"no positive frames: none of the {len(frames.files)} episodes is labelled a success "
                       "(the classifier learns success from successful episodes)")
    if frames.labels.all():
        raise _Refused("no negative frames: every frame is positive (fewer --last-k, or failed episodes too)")
    train_eps, test_eps = split_episodes(frames.successes, args.held_out, args.seed)
    train_frames, test_frames = frames.subset(train_eps), frames.subset(test_eps)
    _say(f"{len(frames.files)} episodes, {len(frames)} frames of {frames.camera_field} "
         f"{'x'.join(map(str, frames.images.shape[1:]))}: training on {len(train_eps)}, holding out {len(test_eps)}")
    return _fit_and_write(args, frames, train_frames, test_frames, out)


def _fit_and_write(args, frames, train_frames, test_frames, out: Path) -> dict:
    from ..reward import export
    from ..reward.train import TrainConfig, best_f1_threshold, fit, probabilities, scores

    steps = args.steps or 1000
    if args.epochs is not None:
        steps = max(1, round(args.epochs * len(train_frames) / args.batch_size))
    config = TrainConfig(steps=steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    try:
        graph, params, figures = fit(train_frames, config)
    except ValueError as err:
        raise _Refused(str(err)) from None
    train_probs = probabilities(graph, params, train_frames.images)
    if args.threshold == "f1":
        threshold, rule = best_f1_threshold(train_probs, train_frames.labels), "best F1 on the training frames"
    else:
        threshold, rule = float(args.threshold), "given"
    held = scores(probabilities(graph, params, test_frames.images), test_frames.labels, threshold) \
        if len(test_frames) else {}
    result = {"out": str(out), "camera": frames.camera_field, "image_shape": list(frames.images.shape[1:]),
              "precision": held.get("precision"), "recall": held.get("recall"), "accuracy": held.get("accuracy"),
              "f1": held.get("f1"), "threshold": threshold, "threshold_from": rule,
              "train_accuracy": scores(train_probs, train_frames.labels, threshold)["accuracy"],
              "train": train_frames.counts(), "held_out": test_frames.counts(),
              "last_k": args.last_k, "held_out_fraction": args.held_out, "seed": args.seed,
              "batch_size": args.batch_size, "lr": args.lr, **figures}
    meta, arrays = export.export(params, frames.camera_field, frames.observation_spec, config.model,
                                 threshold=threshold, threshold_from=rule, metrics=result)
    export.write(out, meta, arrays)
    (out / METRICS_FILE).write_text(json.dumps(result, indent=1) + "\n")
    return result


def register(sub) -> None:
    """Add ``reward`` (with ``train``) to the ``embodyrl`` subcommands."""
    group = sub.add_parser("reward", help="learnt rewards: train a success classifier of camera frames",
                           description="Learnt rewards. embodyrl reward train: a success classifier of camera "
                                       "frames from demonstrations (docs/robots.md). Exit codes: 0 done, 2 bad "
                                       "arguments or demonstrations.")
    commands = group.add_subparsers(dest="reward_command", required=True, metavar="COMMAND",
                                    help="train: fit a success classifier to demonstrations")
    t = commands.add_parser(
        "train", help="fit a success classifier to demonstrations' camera frames",
        description="Label every camera frame of the demonstrations in DEMOS (the last --last-k frames of a "
                    "successful episode positive, every other frame negative), hold out --held-out of the "
                    "episodes, train a small CNN and write DIR/classifier.json and DIR/classifier.npz (the numpy "
                    "runtime's export) and DIR/metrics.json. Prints held-out precision, recall and accuracy as "
                    "one JSON object. Exit codes: 0 done, 2 bad arguments or demonstrations (none, no camera "
                    "field, no successful episode, an unreadable file: named).")
    t.add_argument("demos", nargs="+", metavar="DEMOS", help="directories written by embodyrl record")
    t.add_argument("--out", required=True, metavar="DIR", help="directory to write the classifier into (new)")
    t.add_argument("--camera", metavar="FIELD",
                   help="the camera field to classify (default: the only HxWxC uint8 field)")
    t.add_argument("--last-k", type=int, default=5, metavar="K",
                   help="frames at the end of a successful episode that are positive (default 5)")
    t.add_argument("--held-out", type=float, default=0.2, metavar="FRACTION",
                   help="share of the successful and of the failed episodes held out for precision and recall "
                        "(default 0.2; 0: none)")
    length = t.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, metavar="N", help="gradient steps (default 1000)")
    length.add_argument("--epochs", type=float, metavar="E",
                        help="passes over the training frames instead of --steps")
    t.add_argument("--batch-size", type=int, default=64, help="frames per step, half of them positive (default 64)")
    t.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default 1e-3)")
    t.add_argument("--seed", type=int, default=0, help="the split, initial weights and batches (default 0)")
    t.add_argument("--threshold", type=_threshold, default=0.5, metavar="P",
                   help="the probability from which a frame is a success (default 0.5), or f1: the one with the "
                        "best F1 on the training frames")
    t.set_defaults(func=train)
