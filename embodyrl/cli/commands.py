"""The ``embodyrl`` command."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

from .cluster import register_launch
from .extras import missing_extra
from .processes import DEBUG_ENV
from .security import (
    SecurityOptionError,
    add_actor_options,
    add_learner_options,
    add_train_options,
)


def _overrides(extra: list[str]) -> list[tuple[str, str]]:
    """``--ddpg.actor_lr 3e-4`` and ``--ddpg.actor_lr=3e-4`` pairs from the unparsed arguments."""
    pairs, i = [], 0
    while i < len(extra):
        arg = extra[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ValueError(f"unexpected argument {arg!r}; overrides look like --section.key VALUE")
        if "=" in arg:
            key, raw = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(extra):
                raise ValueError(f"{arg[2:]}: no value given")
            key, raw = arg[2:], extra[i + 1]
            i += 2
        pairs.append((key.replace("-", "_"), raw))
    return pairs


class _Refused(Exception):
    """Bad arguments or configuration: the message goes to stderr, the exit code is 2."""


def _resolve_config(args, run_dir: Path | None, extra_named: dict | None = None):
    """The robot, then its defaults (or the run's config.json with --resume), the YAML file, then
    overrides; the robot's specs checked (a remote robot is reached for them) and recorded."""
    from ..config import (
        TrainConfig,
        build_given,
        default_config,
        from_dict,
        load,
        to_dict,
        warm_up_refusal,
    )
    from ..robot import RobotFileError, of_config
    from ..robot import load as load_robot

    if run_dir is not None:
        started = (run_dir / "config.json").exists()
        if args.resume and not started:
            raise _Refused(f"--resume: {run_dir} holds no run to resume")
        if started and not args.resume:
            raise _Refused(f"{run_dir} already holds a run; pass --resume to continue it")
    if args.config is not None and not Path(args.config).is_file():
        raise _Refused(f"--config: no file {args.config}")
    named = {"steps": args.steps, "seed": args.seed, **(extra_named or {})}
    named = [(k, str(v)) for k, v in named.items() if v is not None]
    implied: dict = {}  # what the robot file sets: given, as the YAML file's keys are
    try:
        if run_dir is not None and args.resume:
            base = load(run_dir / "config.json")
            if not _same_robot(args.task, base):
                paths = [f["path"] for f in ((base.robot or {}).get("files") or {}).values()]
                raise _Refused(f"{run_dir} is a run of {base.task!r}" + (f" ({', '.join(paths)})" if paths else "")
                               + f", not {args.task!r}")
            robot = of_config(base)  # a robot file changed since is refused here
            base = _resumed(base, run_dir)
        else:
            robot = load_robot(args.task)
            data = to_dict(default_config(args.task))
            implied = robot.config_defaults()
            _merge_into(data, implied)  # what the robot file implies; --config and overrides win
            base = from_dict(TrainConfig, data)
        config, given = build_given(base, args.config, _overrides(args.overrides) + named)
    except RobotFileError as err:
        raise _Refused(str(err)) from None
    except ValueError as err:
        raise _Refused(f"config: {err}") from None
    try:
        # the learner checks the algorithm against the task; an actor (maybe without JAX) takes its config
        layout = robot.layout() if args.command == "actor" else _check_task(config, robot)
    except RobotFileError as err:
        raise _Refused(str(err)) from None
    except ValueError as err:
        raise _Refused(f"task {config.task!r}: {err}") from None
    # a budget that ends within the warm-up is refused unless the user set it so (a resumed run was not)
    if args.command in ("train", "learner", "launch") and not (run_dir is not None and args.resume):
        reason = warm_up_refusal(config, given, implied)
        if reason is not None:
            raise _Refused(reason)
    if config.synchronous and args.command != "train":
        raise _Refused(f"synchronous: the synchronous loop runs in one process, as embodyrl train --synchronous; "
                       f"embodyrl {args.command} runs the learner and actors apart")
    if not (run_dir is not None and args.resume):  # where this robot came from, for --resume, eval, export
        config = dataclasses.replace(config, robot=dataclasses.replace(robot, recorded_layout=layout).record())
    return config


def _merge_into(data: dict, defaults: dict) -> None:
    for key, value in defaults.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            _merge_into(data[key], value)
        else:
            data[key] = value


def _same_robot(source: str, config) -> bool:
    """Whether ``source`` names the run's robot: the same names, and the same robot files by any path."""
    files = (config.robot or {}).get("files") or {}
    given, recorded = ((source,), (config.task,)) if config.task in files else (source.split("+"), config.task.split("+"))
    if len(given) != len(recorded):
        return False
    for mine, theirs in zip(given, recorded, strict=True):
        if theirs in files:  # a robot file: the file the run recorded
            if Path(mine).expanduser().resolve() != Path(files[theirs]["path"]):
                return False
        elif mine != theirs:
            return False
    return True


def _resumed(base, run_dir: Path):
    """A resumed run whose replay already holds rows takes no second random warm-up, and its actors
    draw new episodes (seeded from the rows held): config.json records both; --actor.random_steps
    still decides."""
    from ..replay.contents import rows_added

    rows = rows_added(run_dir / "replay")
    if not rows:
        return base
    return dataclasses.replace(base, actor=dataclasses.replace(base.actor, random_steps=0, resumed_at_rows=rows))


def _check_task(config, robot):
    """What the task's specs refuse, before anything is written: a robot file's fields the robot
    does not observe, device kinds that do not fit one layout, an algorithm that cannot act over it
    or in a kind's action space, camera images flattened into an MLP. Returns the layout."""
    from ..algos import registry
    from ..algos.encoders import check_images
    from ..algos.heads import over
    from ..algos.interface import refusal

    layout = robot.layout()
    algorithm = over(config.algo, layout)
    for kind in layout.kinds:
        reason = refusal(algorithm, kind.action_spec)
        if reason is not None:
            raise ValueError(reason)
        encoder = getattr(algorithm.config, "encoder", None)
        if encoder is not None:
            check_images(kind.observation_spec, encoder, f"{registry.get(algorithm.name).section}.encoder")
    return layout


def _demos(args) -> dict:
    """``--demos DIR`` (repeatable) as the ``learner.demos`` override, absolute paths (a resumed run
    finds them from anywhere)."""
    if not args.demos:
        return {}
    for directory in args.demos:
        if not Path(directory).is_dir():
            raise _Refused(f"--demos: no directory {directory}")
    return {"learner.demos": json.dumps([str(Path(d).resolve()) for d in args.demos])}


def _keep_yaml(args, run_dir: Path) -> None:
    """The --config file as written, beside config.json (once every check has passed)."""
    if args.config is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_bytes(Path(args.config).read_bytes())


def _run_dir(args) -> Path:
    task = "+".join(Path(part).stem if part.lower().endswith((".yaml", ".yml")) else part
                    for part in args.task.split("+"))  # a robot file: its name
    task = task.replace(":", "-").replace("/", "-")  # gym:embodyrl/Pendulum-v0 -> one folder
    return Path(args.run_dir or f"runs/{task}-{time.strftime('%Y%m%d-%H%M%S')}")


def train_config(args, run_dir: Path | None, console_key: str = ""):
    """The settings ``embodyrl train`` (or ``launch``) runs with: the run's options over the task's
    defaults, ``--synchronous`` checked against what the synchronous loop can drive."""
    synchronous = getattr(args, "synchronous", False)  # a train option; launch places processes
    config = _resolve_config(args, run_dir, {"actors": args.actors, "actor.teleop": args.teleop, "algorithm": args.algorithm,
                                             "console": args.console, "console_key": console_key,
                                             "synchronous": True if synchronous else None, **_demos(args)})
    if config.synchronous:
        from ..learner.synchronous import refusal, synchronous_config

        reason = "it does not resume" if args.resume else refusal(synchronous_config(config))
        if reason is not None:
            raise _Refused(f"--synchronous: {reason}")
    return config


def _train(args) -> int:
    from .launch import TrainingError, train
    from .person import at_terminal
    from .security import check_address, console_key_pairs, local_key_pairs

    run_dir = _run_dir(args)
    console_key = args.console_key
    if args.curve and args.console and not console_key:  # the pairs embodyrl console --curve uses
        console_key = str(console_key_pairs(run_dir / "keys").secret_key_file.with_suffix(".key"))
    config = train_config(args, run_dir, console_key)
    check_address(config.learner.bind, args.curve or None, args.insecure, "--learner.bind")
    if config.learner.hosts > 1:
        raise _Refused("learner.hosts: train runs one learner here; start one `embodyrl learner` "
                       "per host instead (docs/scaling.md)")
    _check_devices(config)
    if config.console:
        check_address(config.console, config.console_key or None, args.insecure, "--console")
    _keep_yaml(args, run_dir)
    keys = local_key_pairs(run_dir / "keys") if args.curve else None
    signal.signal(signal.SIGTERM, _interrupted)  # a stop signal stops every process, as Ctrl-C does
    try:
        progress = "quiet" if args.quiet else args.progress
        if progress == "auto" and at_terminal(config):
            progress = "plain"  # the live panel would redraw over the person's prompts
        summary = train(config, run_dir, progress=progress,
                        keys=keys, allow_insecure=args.insecure)
    except KeyboardInterrupt:
        print("embodyrl: interrupted; every process stopped", file=sys.stderr)
        return 130
    except TrainingError as err:
        print(f"embodyrl: training failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    print(f"run directory: {run_dir}", file=sys.stderr)
    return 0


def _json_lines(collectives: bool):
    """Where the learner's JSON lines go: standard output, kept for them alone when the hosts' CPU
    collectives (gloo) will print their own notes there (those go to standard error instead)."""
    if not collectives:
        return sys.stdout
    sys.stdout.flush()
    lines = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return lines


def _check_devices(config, hosts=None) -> None:
    """Refuse ``learner.devices`` this host cannot give or the batch cannot split over, before any
    process starts."""
    from ..learner.build import placement_of
    from ..learner.hosts import OneHost

    try:
        placement_of(config, hosts or OneHost())
    except ValueError as err:
        raise _Refused(str(err)) from None


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def _learner(args) -> int:
    if args.task == "coupling":  # a coupled model's learner: its own configuration, no task
        from .coupling import CouplingConfigError, run_learner

        try:
            return run_learner(args)
        except CouplingConfigError as err:
            raise _Refused(f"learner coupling: {err}") from None
    from ..config import save
    from ..learner import make_learner
    from ..learner.hosts import join
    from .processes import stop_on_signals
    from .security import check_address, server_keys

    run_dir = _run_dir(args)
    keys = server_keys(args)
    config = _resolve_config(args, run_dir, {"algorithm": args.algorithm, "learner.bind": args.bind, **_demos(args)})
    record = _rendezvous(args, keys)
    if record is not None:  # its own key pair, the record's actors admitted, its port kept across restarts
        from ..cluster.roles import learner_bind, learner_keys

        keys = learner_keys(run_dir, record)
        config = dataclasses.replace(config, learner=dataclasses.replace(
            config.learner, bind=learner_bind(record, config.learner.bind)))
    check_address(config.learner.bind, keys, args.insecure, "--bind")
    _keep_yaml(args, run_dir)
    should_stop = stop_on_signals()
    run_dir.mkdir(parents=True, exist_ok=True)
    save(config, run_dir / "config.json")
    lines = _json_lines(config.learner.hosts > 1)
    hosts = join(config.learner)  # before anything touches JAX's backends
    _check_devices(config, hosts)
    learner = make_learner(config, run_dir, keys=keys, allow_insecure=args.insecure, hosts=hosts)
    ingest = {"ingest_ports": learner.server.ingest_ports} if hasattr(learner.server, "ingest_ports") else {}
    (run_dir / "learner.json").write_text(json.dumps({"endpoint": learner.endpoint, **ingest}) + "\n")
    if record is not None:
        from ..cluster.roles import publish

        publish(record, learner, run_dir, args.advertise)
    print(json.dumps({"endpoint": learner.endpoint, "run_dir": str(run_dir),
                      "resumed_from_updates": learner.counters.updates if learner.resumed else None}),
          file=lines, flush=True)
    counters = learner.run(should_stop, restart_on_stop=True)  # its actors run elsewhere: they wait for it
    print(json.dumps(dataclasses.asdict(counters)), file=lines, flush=True)
    return 130 if should_stop() else 0


def _rendezvous(args, keys):
    """The rendezvous record ``--rendezvous DIR`` names (None without it); it replaces the keys
    and the address given by hand."""
    if not args.rendezvous:
        return None
    if keys is not None:
        raise SecurityOptionError("--rendezvous: the keys come from the record; drop --secret-key and "
                                  "--authorized-keys / --server-key")
    from ..cluster.rendezvous import FileRecord

    return FileRecord(args.rendezvous)


def _actor(args) -> int:
    from ..hal.wire.client import HandshakeFailed, LinkError
    from ..robot import RobotFileError
    from .processes import actor_main, stop_on_signals
    from .security import check_address, client_keys

    keys = client_keys(args)
    record = _rendezvous(args, keys)
    if (record is None) == (args.connect is None):
        raise SecurityOptionError("give the learner's --connect ENDPOINT or a --rendezvous DIR (one of them)")
    if record is not None:  # its own key pair on this node, the learner found through the record
        from ..cluster.rendezvous import RendezvousError
        from ..cluster.roles import actor_keys

        try:
            entry, keys = actor_keys(record, args.index, Path(args.key_dir).expanduser(), args.wait_s,
                                     stop_on_signals())
        except RendezvousError as err:
            print(f"embodyrl: actor: {err}", file=sys.stderr)
            return 1
        args.connect = entry.endpoint
    check_address(args.connect, keys, args.insecure, "--connect")
    config = _resolve_config(args, None, {"actor.teleop": args.teleop, "console": args.console,
                                          "console_key": args.console_key})
    if config.console:
        check_address(config.console, config.console_key or None, args.insecure, "--console")
        if config.console_key and keys is None:
            raise SecurityOptionError("--console-key: a CurveZMQ console needs this actor's --secret-key")
    if args.log_dir:
        from ..cluster.roles import with_spools

        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        config = with_spools(config, Path(args.log_dir))  # a SIGKILL, then a restart, loses nothing
    try:
        actor_main(dataclasses.asdict(config), args.connect, args.index, args.log_dir, args.max_steps,
                   keys=keys, allow_insecure=args.insecure)
    except (LinkError, RobotFileError) as err:
        print(f"embodyrl: actor: {err}", file=sys.stderr)
        # a certain cause (refused, a failed CurveZMQ handshake, a robot not reached) is 2: trying again will not help
        certain = isinstance(err, (HandshakeFailed, RobotFileError)) or isinstance(err.__cause__, HandshakeFailed)
        return 2 if certain else 1
    return 0


def _is_finished_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run's config and saved policy (if not, says so on stderr)."""
    for needed in ("config.json", "policy"):
        if not (run_dir / needed).exists():
            print(f"embodyrl: {run_dir}: no {needed} (not a finished run directory?)", file=sys.stderr)
            return False
    return True


def _eval(args) -> int:
    from ..config import load
    from ..hal.operator import OperatorGone, TerminalOperator
    from ..robot import RobotFileError
    from .evaluate import evaluate_saved_run, render_strip
    from .person import reset_mode

    run_dir = Path(args.run_dir)
    if not _is_finished_run(run_dir):
        return 2
    if args.episodes is not None and args.episodes < 1:
        print("embodyrl: --episodes must be at least 1", file=sys.stderr)
        return 2
    operator = None
    try:
        if reset_mode(load(run_dir / "config.json")) == "operator":  # wait for the person between episodes
            operator = TerminalOperator(0)  # standard input: a terminal, or a pipe of answers
        result = evaluate_saved_run(run_dir, args.episodes, args.seed, operator)
        if args.strip:
            result.update(render_strip(run_dir, Path(args.strip), frames=args.frames,
                                       size=(args.width, args.height), seed=result["seed"], device=args.device))
    except RobotFileError as err:  # the run's robot cannot be rebuilt as recorded
        print(f"embodyrl: eval: {err}", file=sys.stderr)
        return 2
    except (ValueError, OperatorGone) as err:
        print(f"embodyrl: eval: {err}", file=sys.stderr)
        return 1
    finally:
        if operator is not None:
            operator.close()
    print(json.dumps(result, indent=2))
    return 0


def _export(args) -> int:
    from ..hal.runtime import ExportError
    from .export import export_run

    run_dir = Path(args.run_dir)
    if not _is_finished_run(run_dir):
        return 2
    try:
        json_path, npz_path = export_run(run_dir, Path(args.out), args.device)
    except (ValueError, ExportError, NotImplementedError) as err:
        print(f"embodyrl: export: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"graph": str(json_path), "arrays": str(npz_path)}))
    return 0


def _replay(args) -> int:
    from .replay_report import format_report, inspect

    try:
        report = inspect(Path(args.directory))
    except FileNotFoundError as err:
        print(f"embodyrl: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"embodyrl: replay: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _plot(args) -> int:
    from .plot import plot_runs

    try:
        result = plot_runs([Path(r) for r in args.run_dirs], Path(args.out), args.metric, args.x,
                           keep=args.keep_artifacts)
    except (FileNotFoundError, ValueError) as err:
        print(f"embodyrl: plot: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


@contextlib.contextmanager
def _stdout_to_stderr():
    """Send what a benchmark and its child processes write to stdout (Ray's raylet warnings, for
    one) to stderr, so that stdout holds the one JSON object ``--json`` promises."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _bench(args) -> int:
    from .. import bench

    try:
        with _stdout_to_stderr() if args.json else contextlib.nullcontext():
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


def _bench_names() -> list[str]:
    from .. import bench

    return bench.names()


def _tasks(args) -> int:
    from .. import envs

    gym_ids = {task: env_id for task, (env_id, _) in envs.GYMNASIUM_IDS.items()}
    if args.json:
        print(json.dumps({"tasks": envs.names(), "gymnasium_ids": gym_ids}))
        return 0
    for name in envs.names():
        registered = f"  (gymnasium: {gym_ids[name]})" if name in gym_ids else ""
        print(f"{name}{registered}")
    print("gym:ID  any Gymnasium id with a Box action space, e.g. gym:Pendulum-v1")
    print("module:factory  your own (device, task) factory, e.g. mypackage.robots:make")
    print("ROBOT.yaml  a robot file declaring your robot (docs/robots.md)")
    return 0


def _keys(args) -> int:
    from ..hal.wire.security import generate_keys

    public, secret = generate_keys(args.directory, args.name)
    print(f"public key (share it): {public}\nsecret key (keep it):  {secret}")
    return 0


class _Registered:
    """The registry's algorithm names as argparse ``choices``, read on first use: JAX loads only
    when --algorithm is given or help is shown, so ``embodyrl keys`` runs on an edge install."""

    def __iter__(self):
        from ..algos import registry

        return iter(registry.names())

    def __contains__(self, name) -> bool:
        return name in tuple(self)


TASK_HELP = ("a task: pendulum, pendulum_pixels, arm_reach, ... (embodyrl tasks lists them), "
             "or gym:ID for any Gymnasium id with a Box action space, e.g. gym:Pendulum-v1; "
             "or your own robot: module:factory returning (device, task), or a robot file ROBOT.yaml "
             "(docs/robots.md); "
             "tasks joined by + (pendulum+arm_reach) train one policy over devices of different shapes")
DEMOS_HELP = ("a directory of recorded demonstrations (embodyrl record) loaded into the replay as "
              "source=demonstration, once however often the run resumes; repeat for several (learner.demos)")


def add_run_arguments(t: argparse.ArgumentParser) -> None:
    """What ``train`` and ``launch`` take: the task, its budget and run directory, settings."""
    t.add_argument("task", help=TASK_HELP)
    t.add_argument("--steps", type=int, help="environment steps, summed over all actors")
    t.add_argument("--run-dir", help="where the run directory goes (default runs/TASK-TIME)")
    t.add_argument("--seed", type=int, help="seed of the learner and actors (default 0)")
    t.add_argument("--actors", type=int, help="number of actor processes")
    t.add_argument("--algorithm", choices=_Registered(), metavar="NAME",
                   help="algorithm: %(choices)s (default: the task's, else the first; see docs/algorithms.md)")
    t.add_argument("--config", metavar="FILE.yaml", help="YAML file merged over the task's defaults")
    t.add_argument("--progress", choices=("auto", "live", "plain"), default="auto",
                   help="live: a rich panel; plain: a line every 5 s; auto (default): live on a terminal")
    t.add_argument("--quiet", action="store_true", help="no progress at all (for logs and CI)")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in --run-dir: its checkpoint, its replay, its actors' spools")
    t.add_argument("--demos", action="append", metavar="DIR", help=DEMOS_HELP)
    add_train_options(t)
    from .console import add_console_option
    from .record import add_teleop_option

    add_teleop_option(t)
    add_console_option(t)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embodyrl", description="Online RL on robots and simulators: train, run a learner or "
                                     "actors by address, evaluate, inspect replay, plot, benchmark.",
        epilog="embodyrl COMMAND --help describes each command. Exit codes: 0 done, 1 the job "
               "failed, 2 bad arguments, configuration or directory (or an extra this install lacks: "
               "the message names it), 130 interrupted.")
    parser.add_argument("--debug", action="store_true",
                        help="a failing device or driver shows its traceback (default: one line naming the cause)")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "train", help="train a task with local learner and actor processes",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train TASK. Settings come from the task's defaults, then --config FILE.yaml, "
                    "then dotted overrides.",
        epilog="overrides: any config field as --SECTION.FIELD VALUE (or =VALUE), e.g.\n"
               "  --ddpg.actor_lr 3e-4  --learner.updates_per_step 2  --eval_episodes 5\n"
               "  --ddpg.hidden_sizes '[64, 64]'  (lists in YAML syntax)\n"
               "progress: a live panel when stdout and stderr are terminals and no person answers there\n"
               "  (--teleop keyboard or reset: operator), else a line every 5 s;\n"
               "  the summary JSON goes to stdout, progress and messages to stderr\n"
               "exit codes: 0 done, 1 training failed, 2 bad arguments or config, 130 interrupted")
    add_run_arguments(t)
    t.add_argument("--synchronous", action="store_true",
                   help="one process, one environment step then its updates (CleanRL's loop): the reference "
                        "the learner and actor processes are measured against (off-policy, one simulated actor)")
    t.set_defaults(func=_train)
    register_launch(sub, add_run_arguments)
    overrides_epilog = ("overrides: any config field as --SECTION.FIELD VALUE (or =VALUE), e.g.\n"
                        "  --ddpg.actor_lr 3e-4  --learner.updates_per_step 2\n")
    ln = sub.add_parser(
        "learner", help="run only the learner; actors on other machines dial its address",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the learner of TASK in this process. Prints one JSON line "
                    '{"endpoint": ..., "run_dir": ...} once it listens, and the counters when '
                    "the step budget is reached. Start actors with: embodyrl actor TASK "
                    "--connect ENDPOINT --config RUN_DIR/config.json. TASK coupling runs a coupled "
                    "model's learner (--config FILE.yaml with coupling, learner and training sections; "
                    "--steps counts column steps; docs/coupling.md): ranks of a Python, C or Fortran "
                    "model dial the endpoint, with the policy export it prints",
        epilog=overrides_epilog + "a --bind off this machine needs --secret-key and --authorized-keys, "
               "or --insecure\nexit codes: 0 done, 2 bad arguments, config or keys, 130 stopped by a signal")
    ln.add_argument("task", help=TASK_HELP)
    ln.add_argument("--bind", help="address to listen on (default learner.bind, tcp://127.0.0.1:*); "
                                   "e.g. tcp://0.0.0.0:5555 to accept other machines")
    ln.add_argument("--run-dir", help="where the run directory goes (default runs/TASK-TIME)")
    ln.add_argument("--config", metavar="FILE.yaml", help="YAML file merged over the task's defaults")
    ln.add_argument("--steps", type=int, help="environment steps, summed over all actors")
    ln.add_argument("--seed", type=int, help="seed of the learner (default 0)")
    ln.add_argument("--algorithm", choices=_Registered(), metavar="NAME",
                    help="algorithm: %(choices)s (default: the task's, else the first)")
    ln.add_argument("--resume", action="store_true", help="continue the run in --run-dir")
    ln.add_argument("--demos", action="append", metavar="DIR", help=DEMOS_HELP)
    ln.add_argument("--rendezvous", metavar="DIR",
                    help="write this learner's entry (endpoint, public key, run id, incarnation) to the "
                         "rendezvous record in DIR and admit the actor keys added there; its key pair "
                         "is made in RUN_DIR/keys (docs/scaling.md)")
    ln.add_argument("--advertise", metavar="HOST",
                    help="with --rendezvous and a wildcard --bind: the host actors dial (default: this "
                         "node's address)")
    add_learner_options(ln)
    ln.set_defaults(func=_learner)
    a = sub.add_parser(
        "actor", help="run one actor against a learner's address",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run actor INDEX of TASK in this process, connected to the learner at --connect. "
                    "Its config must match the learner's: pass the learner's RUN_DIR/config.json as "
                    "--config (JSON is YAML). Ends when the learner says goodbye.",
        epilog=overrides_epilog + "a --connect off this machine needs --secret-key and --server-key, "
               "or --insecure\nexit codes: 0 done, 1 no learner answered, 2 bad arguments, config or keys")
    a.add_argument("task", help=TASK_HELP)
    a.add_argument("--connect", metavar="ENDPOINT", help="the learner's endpoint, tcp://HOST:PORT")
    a.add_argument("--rendezvous", metavar="DIR",
                   help="find the learner through the rendezvous record in DIR (RUN_DIR/rendezvous on a "
                        "shared filesystem) instead of --connect: this actor makes its own key pair in "
                        "--key-dir and adds only its public key to the record (docs/scaling.md)")
    a.add_argument("--key-dir", default="~/.cache/embodyrl/keys",
                   help="where this node keeps the actor's key pair with --rendezvous (default %(default)s)")
    a.add_argument("--wait-s", type=float, default=600.0,
                   help="with --rendezvous: longest wait for the learner's entry (default %(default)s)")
    a.add_argument("--index", type=int, default=0, help="this actor's id, unique per learner (default 0)")
    a.add_argument("--config", metavar="FILE", help="the learner's config.json, or a YAML file")
    a.add_argument("--log-dir", help="append the actor's counters to LOG_DIR/actor-INDEX.jsonl and its "
                                     "batch ledger (seq, rows, digest) to LOG_DIR/actor-INDEX.ledger.jsonl; "
                                     "its spool and journal go to LOG_DIR/spools unless actor.spool_dir names "
                                     "a place, so an actor restarted there after a kill loses nothing")
    a.add_argument("--max-steps", type=int, metavar="N",
                   help="stop after N control steps, once the learner has acknowledged them (or "
                        "actor.flush_timeout_s has passed); default: run until the learner says goodbye")
    a.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    a.add_argument("--seed", type=int, help="seed (the actor's own is seed * 1000 + index)")
    add_actor_options(a)
    a.set_defaults(func=_actor, resume=False)
    e = sub.add_parser("eval", help="run a run's saved policy on its task; print JSON",
                       description="Evaluate RUN_DIR's saved policy (policy/) on the task in its "
                                   "config.json, without exploration. Prints one JSON object: "
                                   "return_mean, return_std, returns, and the task's metrics (*_mean). "
                                   "Exit codes: 0 done, 1 evaluation failed, 2 bad arguments.")
    e.add_argument("run_dir", help="a run directory written by embodyrl train")
    e.add_argument("--episodes", type=int, help="episodes to run (default: the run's eval_episodes)")
    e.add_argument("--seed", type=int, help="seed of the first episode (default: 10000 + the run's seed)")
    e.add_argument("--strip", metavar="OUT.png",
                   help="also render one episode offscreen with MuJoCo as a PNG image strip")
    e.add_argument("--frames", type=int, default=8, help="images in the strip (default 8)")
    e.add_argument("--width", type=int, default=160, help="width of each image (default 160)")
    e.add_argument("--height", type=int, default=120, help="height of each image (default 120)")
    e.add_argument("--device", help="for --strip on a run over several devices (task a+b): the device's task")
    e.set_defaults(func=_eval)
    x = sub.add_parser("export", help="write a run's saved policy for the numpy runtime (no JAX on the robot)",
                       description="Export RUN_DIR's saved policy as OUT.json (the layer graph) and OUT.npz "
                                   "(the arrays), loaded by embodyrl.hal.runtime.load with numpy alone. "
                                   "Exit codes: 0 done, 2 bad arguments, directory or network.")
    x.add_argument("run_dir", help="a run directory written by embodyrl train")
    x.add_argument("out", help="output path without suffix (OUT.json and OUT.npz are written)")
    x.add_argument("--device", help="for a run over several devices (task a+b): the device's task to export")
    x.set_defaults(func=_export)
    r = sub.add_parser("replay", help="inspect a persistent replay: size, sources, actors, versions",
                       description="Report what a replay directory holds, read-only (safe beside a "
                                   "running learner): size, capacity, chunks, rows by source and by "
                                   "actor, policy versions seen, committed sequence numbers. "
                                   "Exit codes: 0 done, 1 corrupt replay, 2 no replay there.")
    r.add_argument("directory", help="a run directory or its replay/ directory")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=_replay)
    p = sub.add_parser("plot", help="PNG learning curves comparing runs, seeds aggregated",
                       description="Plot METRIC against X from each run's metrics.jsonl. Runs whose "
                                   "config.json match apart from the seed form one group, drawn as the "
                                   "mean with the min-max spread shaded. Prints JSON of what was drawn. "
                                   "Exit codes: 0 done, 2 bad run directory or metric (or matplotlib missing).")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    p.add_argument("--out", default="curves.png", help="PNG to write (default curves.png)")
    p.add_argument("--metric", default="episode_return", help="y: a metrics.jsonl key (default episode_return)")
    p.add_argument("--x", default="env_steps", help="x: a metrics.jsonl key (default env_steps)")
    p.add_argument("--keep-artifacts", action="store_true",
                   help="also copy each run's config.json, summary.json and metrics.jsonl (gzipped when "
                        "large) into OUT's name without .png, one folder per run, so the figure can be "
                        "checked and redrawn once the runs are gone; a run without them is refused")
    p.set_defaults(func=_plot)
    b = sub.add_parser("bench", help="run a shipped benchmark against its baseline",
                       description="Run benchmark NAME: the real thing and a baseline measured in the "
                                   "same run, with their ratio. Exit codes: 0 done, 2 unknown benchmark.")
    b.add_argument("name", help=f"benchmark name: {', '.join(_bench_names())}")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    b.set_defaults(func=_bench)
    from ..hal.robot_server import add_arguments as robot_server_arguments

    rs = sub.add_parser("robot-server", help="serve a robot to a remote actor: a robot file's device or a driver",
                        description="On the robot PC: serve the device a robot file declares (a LeRobot robot "
                                    "with its bounds, under the file's safety section) or a driver factory, "
                                    "as python -m embodyrl.hal.robot_server does, to one remote actor.",
                        epilog="exit codes: 0 stopped (SIGTERM or Ctrl-C), 2 bad options, or a robot that "
                               "cannot be built or opened (the message names why)")
    robot_server_arguments(rs)
    rs.set_defaults(func=_robot_server)
    k = sub.add_parser("keys", help="generate a CurveZMQ key pair for a learner or an actor",
                       description="Write DIRECTORY/NAME.key (public: give it to the other side) and "
                                   "DIRECTORY/NAME.key_secret (secret, mode 600: keep it). A learner takes "
                                   "--secret-key and --authorized-keys (a directory of actors' .key files); "
                                   "an actor takes --secret-key and --server-key (the learner's .key). "
                                   "Exit codes: 0 done.")
    k.add_argument("directory", help="where to write NAME.key and NAME.key_secret")
    k.add_argument("name", help="who the keys are for, e.g. learner or robot-3")
    k.set_defaults(func=_keys)
    ts = sub.add_parser("tasks", help="list the task names train, learner and actor accept",
                        description="List the registered tasks and the Gymnasium ids they are registered "
                                    "under (gymnasium.make('embodyrl/Pendulum-v0') after importing "
                                    "embodyrl.envs). Any Gymnasium id works as a task as gym:ID. "
                                    "Exit codes: 0 done.")
    ts.add_argument("--json", action="store_true", help="print one JSON object")
    ts.set_defaults(func=_tasks)
    from .record import add_teleop_option, register

    add_teleop_option(a)
    register(sub)
    from .console import add_console_option
    from .console import register as register_console

    add_console_option(a)
    register_console(sub)
    from .reward import register as register_reward

    register_reward(sub)
    from .relay import register as register_relay

    register_relay(sub)
    return parser


def _robot_server(args) -> int:
    """``embodyrl robot-server SOURCE``: a robot file (:func:`embodyrl.robot.load_device`) or a factory."""
    from ..hal.robot_server import load_factory, run
    from ..robot import is_file, load_device

    return run(args, build=lambda source: load_device(source) if is_file(source) else load_factory(source)())


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names; its exit code. A module of an extra this install lacks,
    whether building the parser, parsing or running needed it, ends the command with one line
    naming the extra to install and exit code 2 (:mod:`.extras`)."""
    args = argparse.Namespace(command=None)
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra and args.command not in ("train", "launch", "learner", "actor"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = extra
        if args.debug:  # for this process and the learner and actors it starts
            os.environ[DEBUG_ENV] = "1"
        return args.func(args)
    except (_Refused, SecurityOptionError) as err:
        print(f"embodyrl: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        message = missing_extra(err, args.command)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
