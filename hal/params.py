"""Parameter trees as flat ``name -> array`` maps, the form weights travel in.

``{"actor": {"layers": {0: {"kernel": w}}}}`` flattens to
``{"actor/layers/0/kernel": w}``; integer keys (list positions) come back as
integers. numpy only, so the edge can rebuild what the learner sends.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

SEPARATOR = "/"


def flatten(tree: Mapping, prefix: str = "") -> dict[str, np.ndarray]:
    flat: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if SEPARATOR in str(key):
            raise ValueError(f"key {key!r} contains {SEPARATOR!r}")
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + SEPARATOR))
        else:
            flat[name] = np.asarray(value)
    return flat


def unflatten(flat: Mapping[str, np.ndarray]) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        *path, leaf = (int(p) if p.isdigit() else p for p in name.split(SEPARATOR))
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def subtree(flat: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The entries under ``prefix/``, with the prefix removed."""
    start = prefix + SEPARATOR
    return {k[len(start):]: v for k, v in flat.items() if k.startswith(start)}
