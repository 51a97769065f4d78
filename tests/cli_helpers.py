"""Running ``embodyrl`` commands for the CLI tests: in subprocesses, as a user would, or through
the command's own ``main`` in this process where no process boundary is under test."""

import contextlib
import io
import os
import signal
import subprocess
import sys


def cli(*args, timeout=120) -> subprocess.CompletedProcess:
    """``embodyrl ARGS...`` to completion, output captured."""
    return subprocess.run([sys.executable, "-m", "embodyrl.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def in_process(*args, cwd=None) -> subprocess.CompletedProcess:
    """``embodyrl ARGS...`` through :func:`embodyrl.cli.commands.main` in this process, in ``cwd``:
    the same parser, checks and messages as the command, for refusals and answers that start no
    other process (a subprocess would import JAX again for each). Returns what :func:`cli` does;
    an exception the command does not turn into an exit code propagates with its traceback.
    The working directory comes first on ``sys.path``, as ``python -m`` puts it (scripted teleop
    and factories import from there); ``sys.path`` is restored after it (a robot file's factory
    adds its own directory too, as the command's own process would for itself)."""
    from embodyrl.cli.commands import main

    out, err, path = io.StringIO(), io.StringIO(), list(sys.path)
    with contextlib.chdir(cwd or os.getcwd()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.path.insert(0, os.getcwd())
        try:
            code = main([str(arg) for arg in args])
        except SystemExit as exit_:  # argparse's refusals
            if isinstance(exit_.code, str):
                print(exit_.code, file=sys.stderr)
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        finally:
            sys.path[:] = path
    return subprocess.CompletedProcess(["embodyrl", *map(str, args)], code, out.getvalue(), err.getvalue())


def cli_in_session(*args, timeout=300) -> tuple[int, str, str, int]:
    """``embodyrl ARGS...`` in its own session, killed with every child if it outlives ``timeout``:
    (return code, stdout, stderr, process group id)."""
    proc = subprocess.Popen([sys.executable, "-m", "embodyrl.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err, proc.pid


def default_sigint() -> None:
    """``preexec_fn`` for a child the test will Ctrl-C: SIGINT back to its default action.

    A shell runs a backgrounded job (``cmd &``) with SIGINT ignored, the child inherits
    that, and Python then never turns SIGINT into KeyboardInterrupt: the test would
    measure how it was launched, not the code.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
