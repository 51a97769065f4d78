"""``embodyrl launch slurm``: sbatch scripts for the learner and the actors, submitted (or only
written, ``--dry-run``).

Two jobs: the learner's, requeued if it dies (it resumes from its run directory), and the actors'
as a job array (one task per actor, each requeued alone), which starts once the learner's job
has started (``--dependency=after``). Both read the run's rendezvous record in the run directory,
which must be on a filesystem every node shares: the learner writes its entry there, each actor
makes its key pair in a node-local directory and adds only its public key. A coupled MPI model's
ranks start with ``srun`` inside the actors' allocation (``--coupled-command``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import TrainConfig, save


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    time_limit: str | None = None
    """``--time`` of both jobs, e.g. ``02:00:00``."""
    learner_gpus: int = 0
    learner_cpus: int = 1
    actor_cpus: int = 1
    key_dir: str = "/tmp/embodyrl-keys"
    """Node-local: where each node keeps its actors' key pairs."""
    python: str = "python3"
    coupled_command: str | None = None
    """A coupled MPI model started with ``srun`` in the actors' allocation."""
    coupled_ranks: int = 0
    extra: tuple[str, ...] = field(default_factory=tuple)
    """More ``#SBATCH`` lines, passed through (``--account=...``, ``--qos=...``)."""


def _header(name: str, run_dir: Path, options: SlurmOptions, output: str, *lines: str) -> list[str]:
    head = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --output={run_dir}/slurm-{output}.out",
            "#SBATCH --requeue", "#SBATCH --open-mode=append"]
    if options.partition:
        head.append(f"#SBATCH --partition={options.partition}")
    if options.time_limit:
        head.append(f"#SBATCH --time={options.time_limit}")
    head += [f"#SBATCH {line}" for line in (*lines, *options.extra)]
    return head + ["set -euo pipefail"]


def write_scripts(config: TrainConfig, run_dir: Path, options: SlurmOptions) -> tuple[Path, Path]:
    """(learner script, actors script) in ``RUN_DIR/slurm``; ``config.json`` written beside them."""
    from .roles import with_spools

    run_dir = Path(run_dir).absolute()
    (run_dir / "slurm").mkdir(parents=True, exist_ok=True)
    save(with_spools(config, run_dir), run_dir / "launch-config.json")
    record = run_dir / "rendezvous"
    embodyrl = f"{options.python} -m embodyrl.cli"
    task = shlex.quote(config.task)
    actors_name = f"embodyrl-actors-{run_dir.name}"
    learner = _header(f"embodyrl-learner-{run_dir.name}", run_dir, options, "learner-%j",
                      f"--cpus-per-task={options.learner_cpus}",
                      *([f"--gpus={options.learner_gpus}"] if options.learner_gpus else []))
    learner += [
        f"cd {shlex.quote(str(run_dir.parent))}",
        "# a requeued learner resumes its run (checkpoint, replay) on the port its record names",
        f"resume=; [ -f {run_dir}/config.json ] && resume=--resume",
        f"{embodyrl} learner {task} --run-dir {run_dir} --config {run_dir}/launch-config.json $resume "
        f"--rendezvous {record} --bind 'tcp://0.0.0.0:*' --advertise \"$(hostname -i | cut -d' ' -f1)\"",
        "# the budget is reached: an actor that joined after the goodbye would wait for a learner",
        f"scancel --name={actors_name} || true"]
    actors = _header(actors_name, run_dir, options, "actor-%A_%a", f"--array=0-{config.actors - 1}",
                     f"--cpus-per-task={options.actor_cpus}",
                     *([f"--ntasks={1 + options.coupled_ranks}"] if options.coupled_command else []))
    actor = (f"{embodyrl} actor {task} --rendezvous {record} --index \"$SLURM_ARRAY_TASK_ID\" "
             f"--key-dir {shlex.quote(options.key_dir)} --config {run_dir}/launch-config.json --log-dir {run_dir}")
    if options.coupled_command:  # the model's ranks beside this actor, in the same allocation
        actors += [f"srun --ntasks={options.coupled_ranks} {options.coupled_command} &",
                   f"srun --ntasks=1 {actor}", "wait"]
    else:
        actors.append(f"exec {actor}")
    paths = run_dir / "slurm" / "learner.sbatch", run_dir / "slurm" / "actors.sbatch"
    for path, lines in zip(paths, (learner, actors), strict=True):
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o755)
    return paths


def submit(scripts: tuple[Path, Path]) -> tuple[str, str]:
    """Submit the learner's job, then the actors' to start once it has started; their job ids."""
    learner = _sbatch(scripts[0])
    return learner, _sbatch(scripts[1], f"--dependency=after:{learner}")


def _sbatch(script: Path, *args: str) -> str:
    proc = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch {script.name}: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def job_state(job_id: str) -> str | None:
    """The job's state as ``squeue`` has it (None once it left the queue)."""
    proc = subprocess.run(["squeue", "--noheader", "--format=%T", "--jobs", job_id], capture_output=True,
                          text=True, timeout=60)
    states = proc.stdout.split()
    return states[0] if proc.returncode == 0 and states else None


def wait_for(job_id: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while job_state(job_id) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still queued or running after {timeout_s:g} s")
        time.sleep(2)


def launch(config: TrainConfig, run_dir: Path, options: SlurmOptions, *, dry_run: bool = False,
           wait: bool = False, timeout_s: float = 24 * 3600) -> dict:
    """Write the scripts; submit them unless ``dry_run``; with ``wait``, wait for the learner's job,
    stop the actors' and write ``summary.json`` as ``train`` does."""
    scripts = write_scripts(config, run_dir, options)
    result = {"scripts": [str(p) for p in scripts], "run_dir": str(Path(run_dir).absolute())}
    if dry_run:
        return result
    learner, actors = submit(scripts)
    result.update(learner_job=learner, actors_job=actors)
    if wait:
        from ..cli.launch import evaluate_run
        from ..runlog import learner_records

        wait_for(learner, timeout_s)
        subprocess.run(["scancel", actors], capture_output=True, timeout=60)
        run_dir = Path(run_dir)
        summary = {"env_steps": learner_records(run_dir)[-1]["env_steps"], "backend": "slurm", **result}
        summary.update(evaluate_run(config, run_dir))
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary
    return result
