"""Package attributes imported on first use, so a package's settings and registry entries load without JAX.

An actor on a robot PC resolves the same config as the learner (every
algorithm's section) but never builds a network; an algorithm package's
``__init__`` imports its plain-data modules (settings, entries) and names the
rest here::

    __getattr__ = exports(__name__, {"DDPG": "algorithm", "make_networks": "networks"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` from submodule ``names[name]``, imported then."""

    def __getattr__(name: str) -> Any:
        try:
            module = names[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
