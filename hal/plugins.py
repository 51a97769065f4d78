"""Importing the user's own code by name (``module:function``), from where the user works.

A robot-file factory, a ``module:factory`` robot and a scripted teleop source
all name a module the user wrote beside the command: the working directory
(and a robot file's own directory) are importable, as ``python -m`` makes the
former, whether or not ``PYTHONPATH`` says so.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType


def import_here(module: str, directory: Path | None = None) -> ModuleType:
    """``module``, with ``directory`` (if given) and the working directory on ``sys.path`` (appended:
    installed packages keep precedence)."""
    for extra in (directory, Path.cwd()):
        if extra is not None and str(extra) not in sys.path:
            sys.path.append(str(extra))
    return importlib.import_module(module)
