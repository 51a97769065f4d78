"""``embodyrl record`` and ``embodyrl demos``: demonstrations from the command line.

``embodyrl record ROBOT --teleop SOURCE --episodes N --out DIR`` drives the
robot with a person's input (:mod:`embodyrl.hal.teleop`) and writes one
demonstration file per episode (:class:`~embodyrl.hal.demos.DemoWriter`,
``DIR/episode-NNNNN.npz``), each with its success label in its meta: the
task's own success signal, or the person's answer at the end of the episode
(``g``/``s``/``f``, :mod:`embodyrl.hal.operator`) when the robot resets by
hand (``reset: operator``) or the task has no success signal. A person's
label also marks the episode's last row (:func:`~embodyrl.hal.operator.apply_label`).

An episode is kept whole or not at all: Ctrl-C (or SIGTERM) drops the
episode in progress and exits 130; the source's abort (``x``, Select, the
right button) drops it and records it again. Files are written under a
temporary name and renamed, so DIR never holds a partial one. Running the
same command again continues the numbering after the files DIR holds, until
it holds N. No JAX is imported: this runs on a robot PC's edge install.

A robot server that cannot be reached is never waited on in silence: a cause that is certain (a
refusal, our key not authorised there, the wrong server key, keys on one side only) ends the
command at once with exit 2 and one line; silence is named in one line while the device keeps
trying (:class:`~embodyrl.hal.drivers.remote.RemoteDevice`). A robot server lost mid-recording
exits 1, the episode in progress discarded.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

EPISODE_FILE = "episode-{:05d}.npz"
_EPISODE = re.compile(r"^episode-(\d+)\.npz$")


def make_robot(source: str):
    """(device, task, reset mode, the file's teleop source) of what ``source`` names
    (:func:`embodyrl.robot.load`): one device kind; a robot file's fields checked against the
    device's specs first."""
    from ..robot import load

    robot = load(source)
    robot.layout()
    device, task = robot.make()
    return device, task, robot.reset, robot.teleop


def episode_files(directory: Path) -> dict[int, Path]:
    """The episode files a recording directory holds, by number."""
    if not directory.is_dir():
        return {}
    found = {}
    for path in directory.iterdir():
        match = _EPISODE.match(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def _say(text: str) -> None:
    print(f"embodyrl record: {text}", file=sys.stderr, flush=True)


def record(args) -> int:
    from ..hal.clock import RateClock
    from ..hal.device import hold_safe
    from ..hal.drivers.remote import RemoteError
    from ..hal.intervention import EpisodeAborted, KeyboardTeleop
    from ..hal.operator import OperatorGone, TerminalOperator, wait_for_answer
    from ..hal.recording import Interrupted, record_episode
    from ..hal.safety import SafeDevice, SafetyConfig
    from ..hal.specs import SpecError
    from ..hal.teleop import TeleopError, close_source, make_source
    from .processes import stop_on_signals

    if args.episodes < 1:
        _say("--episodes must be at least 1")
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        _say(f"--out {out}: not a directory")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    try:
        sink = (_Dataset if args.format == "lerobot" else _Files)(out)
    except ValueError as err:
        _say(str(err))
        return 2
    if sink.count >= args.episodes:
        _say(f"{out} holds {sink.count} episodes already (--episodes {args.episodes}): nothing to do")
        return 0
    try:
        raw, task, reset, teleop = make_robot(args.robot)
    except (KeyError, ValueError) as err:
        _say(str(err.args[0] if isinstance(err, KeyError) else err))
        return 2
    device = raw if isinstance(raw, SafeDevice) else SafeDevice(raw, SafetyConfig())
    try:
        sink.open(device, args.task or task.name or args.robot)
    except SpecError as err:  # a file there that cannot be read
        _device_closed(device)
        _say(str(err))
        return 1
    except ValueError as err:  # what is there was recorded with other specs
        _device_closed(device)
        _say(f"{err} than {args.robot!r}'s: record into another --out")
        return 2
    teleop = args.teleop or teleop
    if not teleop:
        _device_closed(device)
        _say(f"--teleop: missing, and {args.robot} names no teleop source (a robot file's teleop:)")
        return 2
    try:
        source = make_source(teleop, device.action_spec)
    except TeleopError as err:
        _device_closed(device)
        _say(str(err))
        return 2
    operator = TerminalOperator(keys=source.other_keys if isinstance(source, KeyboardTeleop) else None)
    should_stop = stop_on_signals()
    period = device.control_period_s
    clock = None if args.unpaced else RateClock(args.time_scale / period)
    number, count = sink.next_number, sink.count
    started = count
    try:
        with device:
            while count < args.episodes:
                name = sink.name(number)
                _say(f"{name} ({count + 1} of {args.episodes}): go")
                try:
                    episode = record_episode(device, task, source, max_steps=args.episode_steps,
                                             seed=args.seed + number, clock=clock, should_stop=should_stop)
                except EpisodeAborted as err:
                    _say(f"{name}: aborted ({err}); discarded, recording it again")
                    continue
                except Interrupted:
                    return _interrupted(out, count, args.episodes)
                label, by = episode.task_success, "task"
                if reset == "operator" or label is None:
                    answer = wait_for_answer(
                        operator, f"{name}: {episode.length} steps, return {episode.episode_return:.2f}"
                        + ("" if label is None else f", the task says {'success' if label else 'failure'}"),
                        allow_go=label is not None, every=lambda: hold_safe(device),
                        period_s=period, should_stop=should_stop)
                    if answer is None:
                        return _interrupted(out, count, args.episodes)
                    if answer.success is not None:
                        label, by = answer.success, "operator"
                        episode.label(task, label)
                sink.write(name, episode, success=label, labelled_by=by if label is not None else None,
                           robot=args.robot, teleop=teleop, episode_return=episode.episode_return,
                           length=episode.length, control_period_s=period, task=sink.task)
                outcome = "unlabelled" if label is None else ("success" if label else "failure")
                _say(f"{name}: {episode.length} steps, return {episode.episode_return:.2f}, {outcome}"
                     f" ({by}), the person commanded {episode.commanded} steps")
                count += 1
                number += 1
    except OperatorGone as err:
        _say(f"{err}; the episode in progress is discarded")
        return 1
    except RemoteError as err:  # the robot server stopped answering, or refused us, mid-recording
        _say(f"robot server: {err}; the episode in progress is discarded")
        return 1
    finally:
        close_source(source)
        operator.close()
    _say(f"{count - started} episodes recorded; {out} holds {count}")
    print(json.dumps(sink.summary()))
    return 0


class _Files:
    """embodyrl's own demonstrations: one ``.npz`` file per episode (:class:`~embodyrl.hal.demos.DemoWriter`)."""

    def __init__(self, out: Path):
        self.out = out
        for stale in out.glob("*.tmp"):  # a file a killed run was writing: never a whole episode
            stale.unlink()
        self.files = episode_files(out)
        self.count = len(self.files)
        self.next_number = max(self.files, default=-1) + 1
        self.task = ""

    def open(self, device, task: str) -> None:
        from ..hal.demos import read_specs

        self.device, self.task = device, task
        if self.files and read_specs(next(iter(self.files.values()))) != (device.observation_spec,
                                                                          device.action_spec):
            raise ValueError(f"{self.out} holds demonstrations of other specs")

    def name(self, number: int) -> str:
        return EPISODE_FILE.format(number)

    def write(self, name: str, episode, **meta) -> None:
        from ..hal.demos import DemoWriter

        writer = DemoWriter(self.out / name, self.device.observation_spec, self.device.action_spec)
        writer.add(episode.steps)
        writer.close(**meta)

    def summary(self) -> dict:
        return summarise(self.out)


class _Dataset:
    """A LeRobotDataset v3.0 (``--format lerobot``): each episode appended whole, its metadata rewritten
    after it, so a recording stopped between episodes is a dataset LeRobot loads."""

    def __init__(self, out: Path):
        from ..hal.lerobot_dataset import is_dataset, read_info

        self.out = out
        for stale in out.rglob("*.tmp"):
            stale.unlink()
        self.count = int(read_info(out)["total_episodes"]) if is_dataset(out) else 0
        if not self.count and any(out.iterdir()):
            raise ValueError(f"--out {out}: holds files but no LeRobotDataset (meta/info.json); record into an "
                             "empty directory")
        self.next_number = self.count
        self.task = ""

    def open(self, device, task: str) -> None:
        from ..hal import lerobot_demos

        self.task = task
        self.writer = lerobot_demos.writer(self.out, device.observation_spec, device.action_spec,
                                           fps=1.0 / device.control_period_s)

    def name(self, number: int) -> str:
        return f"episode {number}"

    def write(self, name: str, episode, **meta) -> None:
        from ..hal import lerobot_demos

        for frames in lerobot_demos.episodes_of(episode.steps, self.task):
            self.writer.add(frames)

    def summary(self) -> dict:
        return {"directory": str(self.out), "format": "lerobot", "episodes": len(self.writer.episodes),
                "frames": self.writer.frames}


def _export(args, directory: Path) -> int:
    """``embodyrl demos DIR --export lerobot --out OUT``: DIR's episodes as a LeRobotDataset v3.0."""
    from ..hal import lerobot_demos

    if not args.out:
        print("embodyrl demos: --export needs --out DIR (a new directory)", file=sys.stderr)
        return 2
    try:
        done = lerobot_demos.export(directory, args.out, fps=args.fps, task=args.task)
    except ValueError as err:  # a SpecError naming the file, or the output directory not new
        print(f"embodyrl demos: {err}", file=sys.stderr)
        return 2
    print(json.dumps(done))
    return 0


def _device_closed(device) -> None:
    """Release a device made for a recording that does not start (a robot file's remote one is connected)."""
    from ..robot import release

    release(device)


def _interrupted(out: Path, count: int, wanted: int) -> int:
    _say(f"interrupted: the episode in progress is discarded; {out} holds {count} of {wanted} "
         "episodes (run the same command again to record the rest)")
    return 130


# -- embodyrl demos -------------------------------------------------------------------------------

def summarise(directory: Path) -> dict:
    """Episodes, success rate, return and length of the demonstration files in ``directory``.

    A file may hold several episodes (each ends with its final row); its ``success`` label, if
    any, is that of its one episode (files of ``embodyrl record`` hold one each).
    """
    from ..hal.demos import read_meta
    from ..hal.specs import SpecError

    paths = sorted(Path(directory).glob("*.npz"))
    episodes = []
    for path in paths:
        meta = read_meta(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                reward, final = data["reward"], data["final"].astype(bool)
        except (KeyError, ValueError) as err:
            raise SpecError(f"{path}: {err}") from None
        ends = np.flatnonzero(final)
        start = 0
        for end in ends:
            acted = slice(start, end)
            episodes.append({"file": path.name, "length": int(end - start),
                             "return": float(reward[acted].sum()),
                             "success": meta.get("success") if len(ends) == 1 else None})
            start = end + 1
    labelled = [e["success"] for e in episodes if e["success"] is not None]

    def stats(key):
        values = [e[key] for e in episodes]
        if not values:
            return None
        return {"mean": float(np.mean(values)), "min": float(np.min(values)), "max": float(np.max(values))}

    return {"directory": str(directory), "files": len(paths), "episodes": len(episodes),
            "labelled": len(labelled), "successes": int(sum(labelled)),
            "success_rate": float(np.mean(labelled)) if labelled else None,
            "return": stats("return"), "length": stats("length"), "by_episode": episodes}


def format_summary(summary: dict) -> str:
    lines = [f"{summary['directory']}: {summary['episodes']} episodes in {summary['files']} files"]
    if summary["labelled"]:
        lines.append(f"success  {summary['successes']} of {summary['labelled']} labelled "
                     f"({100 * summary['success_rate']:.0f}%)")
    else:
        lines.append("success  no episode is labelled")
    for key in ("return", "length"):
        s = summary[key]
        if s is not None:
            lines.append(f"{key:<7}  mean {s['mean']:.2f}  min {s['min']:.2f}  max {s['max']:.2f}")
    return "\n".join(lines)


def demos(args) -> int:
    from ..hal.specs import SpecError

    directory = Path(args.directory)
    if not directory.is_dir():
        print(f"embodyrl demos: {directory}: no such directory", file=sys.stderr)
        return 2
    if args.export:
        return _export(args, directory)
    if args.out or args.fps or args.task:
        print("embodyrl demos: --out, --fps and --task belong to --export", file=sys.stderr)
        return 2
    from ..hal.lerobot_dataset import dataset_summary, is_dataset

    if is_dataset(directory):  # a LeRobotDataset: what its metadata says
        try:
            print(json.dumps(dataset_summary(directory), indent=2 if args.json else None))
        except ValueError as err:
            print(f"embodyrl demos: {err}", file=sys.stderr)
            return 1
        return 0
    try:
        summary = summarise(directory)
    except SpecError as err:
        print(f"embodyrl demos: {err}", file=sys.stderr)
        return 1
    if summary["files"] == 0:
        print(f"embodyrl demos: {directory} holds no demonstration files (*.npz)", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
    return 0


TELEOP_HELP = ("the person's input: keyboard, gamepad[:PATH], spacemouse[:PATH] (Linux input devices "
               "through evdev, or a recording of their events), lerobot:TYPE[:key=value,...] (a LeRobot "
               "teleoperator, such as a leader arm), or script:module:function (docs/devices.md)")


def register(sub) -> None:
    """Add ``record`` and ``demos`` to the ``embodyrl`` subcommands."""
    r = sub.add_parser(
        "record", help="record demonstrations: a person drives the robot, one file per episode",
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
        description="Drive ROBOT with --teleop and write one demonstration file per episode into "
                    "--out (episode-NNNNN.npz), each labelled with the task's success signal or, for a "
                    "robot reset by hand or a task without one, the person's answer (g go, s success, "
                    "f failure). Ctrl-C discards the episode in progress; the same command resumes.",
        epilog="keyboard: 1-7 push action element 0-6 up, q w e r t y u down, space: the middle, "
               "x: throw the episode away\nexit codes: 0 done, 1 recording failed, 2 bad arguments, "
               "130 interrupted (what was written is whole; run again to resume)")
    r.add_argument("robot", help="a task name, gym:ID, module:factory or a robot file")
    r.add_argument("--teleop", metavar="SOURCE", help=TELEOP_HELP + " (default: the robot file's teleop:)")
    r.add_argument("--format", choices=("embodyrl", "lerobot"), default="embodyrl",
                   help="embodyrl: one .npz per episode (default); lerobot: a LeRobotDataset v3.0 that LeRobot's "
                        "own loader reads (cameras as MP4; needs the dataset extra)")
    r.add_argument("--task", metavar="TEXT", help="the task's description kept with each episode (default: "
                                                  "the task's name)")
    r.add_argument("--episodes", required=True, type=int, metavar="N",
                   help="how many episodes DIR should hold (resuming counts the ones there)")
    r.add_argument("--out", required=True, metavar="DIR", help="directory of the episode files")
    r.add_argument("--seed", type=int, default=0, help="seed of the first episode's reset (default 0)")
    r.add_argument("--episode-steps", type=int, metavar="N", help="episode length (default: the task's)")
    r.add_argument("--time-scale", type=float, default=1.0,
                   help="pace at this multiple of the control rate (a simulator only; default 1)")
    r.add_argument("--unpaced", action="store_true",
                   help="do not pace at the control rate (a script driving a simulator)")
    r.set_defaults(func=record)
    d = sub.add_parser("demos", help="summarise a directory of demonstrations",
                       description="Episodes, success rate, return and length of the demonstration "
                                   "files in DIRECTORY; with --export lerobot --out OUT, the same episodes "
                                   "as a LeRobotDataset v3.0 that LeRobot's own loader reads. Exit codes: 0 "
                                   "done, 1 an unreadable file, 2 no demonstrations there (or OUT not new).")
    d.add_argument("directory", help="a directory written by embodyrl record")
    d.add_argument("--json", action="store_true", help="print one JSON object, with every episode")
    d.add_argument("--export", choices=("lerobot",), help="write DIRECTORY's episodes in another format: "
                                                          "lerobot, a LeRobotDataset v3.0 (--out)")
    d.add_argument("--out", metavar="DIR", help="with --export: the new dataset's directory")
    d.add_argument("--fps", type=float, help="with --export: frames per second (default: the rate the files "
                                             "were recorded at)")
    d.add_argument("--task", metavar="TEXT", help="with --export: the task's description (default: each "
                                                  "file's task or robot)")
    d.set_defaults(func=demos)


def add_teleop_option(parser: argparse.ArgumentParser) -> None:
    """``--teleop SOURCE`` of ``embodyrl actor`` and ``train``: a person may take over any step."""
    parser.add_argument("--teleop", metavar="SOURCE",
                        help="let a person take over any step: " + TELEOP_HELP
                             + "; in train, actor 0's (sets actor.teleop)")
