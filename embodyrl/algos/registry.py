"""The algorithms by name: one :class:`~embodyrl.algos.interface.Entry` each, listed from their packages.

``ddpg`` and ``td3`` share DDPG's code and config section (``td3`` applies
TD3's options on top); ``sac`` and ``rlpd`` share SAC's; ``crossq`` is SAC with
batch-renormalised critics and no targets; ``ppo`` is
on-policy; ``dqn`` acts on discrete actions. Every name resolves to an
:class:`~embodyrl.algos.interface.Algorithm`. The command line's choices,
the config's sections, export and evaluation all read this table, so a new
algorithm is one new package (with its adapter and ``ENTRIES``) plus one
line here.
"""

from __future__ import annotations

from typing import Any

# their settings and entries: no JAX until an algorithm is built
from . import crossq, ddpg, dqn, ppo, sac
from .interface import Algorithm, Entry

ENTRIES: tuple[Entry, ...] = (*ddpg.ENTRIES, *sac.ENTRIES, *crossq.ENTRIES, *ppo.ENTRIES, *dqn.ENTRIES)
"""In the order the command line offers them and config.json writes their sections."""

DEFAULT = "ddpg"
"""What a config (or a saved policy written before policies named theirs) that names none runs."""

_BY_NAME = {entry.name: entry for entry in ENTRIES}


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def get(name: str) -> Entry:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(names())}") from None


def sections() -> dict[str, type]:
    """Config section name -> its settings' type, once per section (``ddpg``, ``sac``, ``ppo``, ``dqn``)."""
    return {entry.section: entry.config_type for entry in ENTRIES}


def heterogeneous() -> tuple[str, ...]:
    """The names that train one policy over several device kinds."""
    return tuple(entry.name for entry in ENTRIES if entry.heterogeneous)


def build(name: str, settings: Any = None) -> Algorithm:
    """Algorithm ``name`` from its section's settings (the section's defaults when None)."""
    entry = get(name)
    return entry.build(entry.config_type() if settings is None else settings)


def configured(config) -> Algorithm:
    """A :class:`~embodyrl.config.TrainConfig`'s algorithm, built from its own section."""
    return build(config.algorithm, getattr(config, get(config.algorithm).section))


def resolve(name: str, ddpg_config: ddpg.DDPGConfig | None, sac_config: sac.SACConfig | None,
            ppo_config: ppo.PPOConfig | None = None) -> Algorithm:
    """Algorithm ``name`` from whichever of the sections it reads (a None section: its defaults)."""
    given = {"ddpg": ddpg_config, "sac": sac_config, "ppo": ppo_config}
    return build(name, given.get(get(name).section))


def as_algorithm(spec) -> Algorithm:
    """``spec`` itself, or the plain algorithm of a bare config (a DDPGConfig runs DDPG, not TD3:
    each package lists its plain form first)."""
    for entry in ENTRIES:
        if type(spec) is entry.config_type:
            return entry.build(spec)
    if isinstance(spec, Algorithm):
        return spec
    raise TypeError(f"not an algorithm or algorithm config: {spec!r}")

