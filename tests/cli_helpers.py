"""Running ``embodyrl`` commands in subprocesses, as a user would, for the CLI tests."""

import os
import signal
import subprocess
import sys


def cli(*args, timeout=120) -> subprocess.CompletedProcess:
    """``embodyrl ARGS...`` to completion, output captured."""
    return subprocess.run([sys.executable, "-m", "embodyrl.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


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
