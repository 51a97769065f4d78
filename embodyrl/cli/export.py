"""Export the learner's policy for the numpy runtime (:mod:`embodyrl.hal.runtime`).

The export is a JSON layer graph plus a flat ``name -> array`` map (format
documented in :mod:`embodyrl.hal.runtime`). Array names are the learner's
published weight names (``actor/layers/0/kernel``...), so a numpy actor
loads an export once and then follows the learner's WEIGHTS messages.

Each algorithm package writes its own export (``export_ddpg``: DDPG's and
TD3's actor; ``export_sac``: SAC's and RLPD's squashed Gaussian;
``export_ppo``; ``export_dqn``) from the shared pieces of
:mod:`embodyrl.algos.runtime_graph`, and its adapter's ``export`` calls it;
:func:`export_device` writes one device's policy (over several device kinds,
its slice of the headed actor). This module finds the right one through the registry: a
network added later is one package whose export passes
``tests/test_runtime.py``'s parity test.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax

from ..algos.ddpg.export import export_ddpg
from ..algos.dqn.export import export_dqn
from ..algos.heads import export_device
from ..algos.ppo.export import export_ppo
from ..algos.sac.export import export_sac
from ..hal import params as flat_params
from ..hal import runtime
from ..hal.layout import DEVICE, FEATURES

__all__ = ["export_ddpg", "export_device", "export_dqn", "export_ppo", "export_run", "export_sac",
           "export_saved_policy"]


def export_saved_policy(policy_dir: str | Path, out: str | Path, config=None) -> tuple[Path, Path]:
    """Turn a saved ``policy/`` directory (see :mod:`embodyrl.policy`) into an export; its ``policy.json``
    names the algorithm and holds its settings (``config``, of the same type, overrides them).
    :func:`export_run` does the same from a run directory, for any of its device kinds."""
    from ..algos import registry
    from ..config import from_dict
    from ..policy import POLICY_FILE, load_policy

    meta = json.loads((Path(policy_dir) / POLICY_FILE).read_text())
    if {spec["name"] for spec in meta["observation_spec"]} == {FEATURES, DEVICE}:
        raise ValueError(f"{policy_dir}: a policy over several devices; export one with "
                         "export_run(run_dir, out, device=...) (embodyrl export RUN OUT --device TASK)")
    entry = registry.get(meta.get("algorithm", registry.DEFAULT))
    if config is None:
        config = from_dict(entry.config_type, meta["config"])  # resolved when saved: TD3's options included
    elif not isinstance(config, entry.config_type):
        raise ValueError(f"{policy_dir}: a {entry.name} policy; config must be a {entry.config_type.__name__}")
    algorithm = registry.as_algorithm(config)
    return _save(out, algorithm, load_policy(Path(policy_dir), algorithm))


def export_run(run_dir: str | Path, out: str | Path, device: str | None = None) -> tuple[Path, Path]:
    """Export the saved policy of a run directory (its ``config.json`` and ``policy/``), any algorithm,
    for one device kind: ``device`` names its task or robot (None: the run's only kind)."""
    from ..config import load
    from ..policy import read_saved
    from ..robot import layout_of

    run_dir = Path(run_dir)
    config = load(run_dir / "config.json")
    layout = layout_of(config)  # a robot's as recorded: exporting never reaches the robot
    device_id = layout.index(device)
    _, weights, version = read_saved(run_dir / "policy")
    params = flat_params.unflatten(flat_params.subtree(weights, "actor"))
    return runtime.save(out, *export_device(config.algo, layout, params, device_id, version))


def _save(out, algorithm, policy) -> tuple[Path, Path]:
    """A loaded policy's export written to ``out``.json and ``out``.npz."""
    networks, _ = algorithm.actor_networks(policy.observation_spec, policy.action_spec, jax.random.key(0))
    return runtime.save(out, *algorithm.export(networks, policy.params, policy.version))
