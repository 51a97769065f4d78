"""Benchmarks that ship with the package: ``embodyrl bench NAME [--json] [--quick]``.

Each benchmark module has ``run(quick: bool) -> dict``: it measures the real
thing and a baseline side by side in the same run, and returns one flat-ish
JSON-able dict with the figures, the baseline and the ratio. ``--quick``
shrinks sizes so tests can exercise the code; figures quoted in
``docs/benchmarks.md`` come from full runs.
"""

from __future__ import annotations

import statistics
import time
from importlib import import_module

# name -> module under embodyrl.bench; each defines run(quick: bool) -> dict
BENCHMARKS: dict[str, str] = {}


def register(name: str, module: str) -> None:
    BENCHMARKS[name] = module


def names() -> list[str]:
    return sorted(BENCHMARKS)


def run(name: str, quick: bool = False) -> dict:
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(names()) or 'none'}")
    module = import_module(f"embodyrl.bench.{BENCHMARKS[name]}")
    return module.run(quick=quick)


SHIPPED = ("hal", "replay", "transport", "drivers", "algos", "chaos", "coupling", "coupling_c", "pixels", "hetero",
           "console", "weights", "scale", "crossq", "ingest")
"""The benchmarks of this package, each its module's name (``crossq`` measures that algorithm's update)."""
for _name in SHIPPED:
    register(_name, _name)


def median_seconds(fn, repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn()`` (which must block until its work is done)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
