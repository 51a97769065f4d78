"""Export the learner's policy for the numpy runtime (:mod:`embodyrl.hal.runtime`).

The export is a JSON layer graph plus a flat ``name -> array`` map (format
documented in :mod:`embodyrl.hal.runtime`). Array names are the learner's
published weight names (``actor/layers/0/kernel``...), so a numpy actor
loads an export once and then follows the learner's WEIGHTS messages.

Covered networks: DDPG's actor (:class:`~embodyrl.algos.networks.MLP`,
ReLU between dense layers, tanh, scaled to the action bounds) and SAC's
(the same MLP whose output splits into the mean and the squashed log std
of a Gaussian: ``gaussian_head``, then tanh and the scale), PPO's, DQN's,
and one device's slice of a heterogeneous run's headed actor
(:func:`export_device`: its input head, the shared trunk, its output head,
which is an ordinary MLP on the device's own specs). A network
added later gets an ``export_*`` here and passes ``tests/test_runtime.py``'s
parity test.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from .algos import ddpg, sac
from .algos.encoders import export_ops
from .algos.networks import MLP, ActionScale
from .hal import params as flat_params
from .hal import runtime
from .hal.steps import NO_POLICY, PolicyVersion


def _body(networks, actor_params):
    """The actor MLP's parameters (with an image encoder they sit under ``policy``)."""
    return actor_params if getattr(networks, "encoder", None) is None else actor_params["policy"]


def _inputs(networks, actor_params) -> tuple[list[dict], str]:
    """(the ops that turn an observation into the MLP's input, the MLP's array prefix)."""
    if getattr(networks, "encoder", None) is None:
        return [{"op": "concat", "fields": list(networks.observation_spec)}], "actor"
    return export_ops(networks.encoder, actor_params["encoder"], "actor/encoder"), "actor/policy"


def export_ddpg(networks: ddpg.DDPGNetworks, actor_params, config: ddpg.DDPGConfig,
                version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of DDPG's deterministic policy plus its Gaussian exploration."""
    actor = nnx.merge(networks.actor_graph, _body(networks, actor_params))
    if type(actor) is not MLP:
        raise NotImplementedError(f"export covers the MLP actor, not {type(actor).__name__}")
    arrays = flat_params.flatten({"actor": jax.device_get(actor_params)})
    n_layers = len(actor.layers)
    graph, prefix = _inputs(networks, actor_params)
    for i in range(n_layers):
        graph.append({"op": "dense", "kernel": f"{prefix}/layers/{i}/kernel", "bias": f"{prefix}/layers/{i}/bias"})
        graph.append({"op": "relu" if i < n_layers - 1 else "tanh"})
    graph.append({"op": "scale", "center": "scale/center", "half_range": "scale/half_range"})
    arrays["scale/center"] = np.asarray(networks.scale.center, np.float32)
    arrays["scale/half_range"] = np.asarray(networks.scale.half_range, np.float32)
    meta = {"format": runtime.FORMAT, "format_version": runtime.FORMAT_VERSION, "algo": "ddpg",
            "policy_version": list(version),
            "observation_spec": networks.observation_spec.to_msg(),
            "action_spec": networks.action_spec.to_msg(),
            "exploration": {"kind": "gaussian", "std": float(config.exploration_noise)},
            "graph": graph}
    return meta, {k: np.asarray(v, np.float32) for k, v in arrays.items()}


def export_saved_policy(policy_dir: str | Path, out: str | Path,
                        config: ddpg.DDPGConfig | None = None) -> tuple[Path, Path]:
    """Turn a saved ``policy/`` directory (see :mod:`embodyrl.policy`) into an export; its ``policy.json``
    names the algorithm and holds its settings (``config`` overrides them for DDPG).
    :func:`export_run` does the same from a run directory, heterogeneous runs included."""
    from .algos.registry import resolve
    from .config import from_dict
    from .policy import POLICY_FILE, load_policy

    meta = json.loads((Path(policy_dir) / POLICY_FILE).read_text())
    if {spec["name"] for spec in meta["observation_spec"]} == {"features", "device"}:
        raise ValueError(f"{policy_dir}: a policy over several devices; export one with "
                         "export_run(run_dir, out, device=...) (embodyrl export RUN OUT --device TASK)")
    name = meta.get("algorithm", "ddpg")
    if name == "ppo":  # an on-policy run's saved policy
        from .algos import ppo

        ppo_config = ppo.PPOConfig(**{**meta["config"], "hidden_sizes": tuple(meta["hidden_sizes"])})
        policy = load_policy(Path(policy_dir), ppo_config)
        networks, _ = ppo.make_networks(policy.observation_spec, policy.action_spec, ppo_config, jax.random.key(0))
        return runtime.save(out, *export_ppo(networks, policy.params, policy.version))
    if name in ("sac", "rlpd"):
        algorithm = resolve("sac", ddpg.DDPGConfig(), from_dict(sac.SACConfig, meta["config"]))
    else:
        algorithm = resolve("ddpg", config or from_dict(ddpg.DDPGConfig, meta["config"]), None)  # TD3's resolved
    policy = load_policy(Path(policy_dir), algorithm)
    networks, _ = algorithm.actor_networks(policy.observation_spec, policy.action_spec, jax.random.key(0))
    export = export_ddpg if algorithm.module is ddpg else export_sac
    return runtime.save(out, *export(networks, policy.params, algorithm.config, policy.version))


def export_run(run_dir: str | Path, out: str | Path, device: str | None = None) -> tuple[Path, Path]:
    """Export the saved policy of a run directory (its ``config.json`` and ``policy/``), any algorithm.

    A heterogeneous run (task ``a+b``) exports one device at a time: ``device`` names its task.
    """
    from . import envs, hetero
    from .config import load
    from .policy import load_policy, read_saved

    run_dir = Path(run_dir)
    config = load(run_dir / "config.json")
    if hetero.is_hetero(config.task):
        parts = envs.parts(config.task)
        if device not in parts:
            raise ValueError(f"task {config.task!r} has several devices: name one of {', '.join(parts)}")
        _, weights, version = read_saved(run_dir / "policy")
        params = flat_params.unflatten(flat_params.subtree(weights, "actor"))
        return runtime.save(out, *export_device(hetero.algorithm(config), params, parts.index(device), version))
    if device is not None and device != config.task:
        raise ValueError(f"task {config.task!r} has one device; {device!r} is not it")
    algorithm = config.off_policy
    policy = load_policy(run_dir / "policy", algorithm)
    networks, _ = algorithm.actor_networks(policy.observation_spec, policy.action_spec, jax.random.key(0))
    if algorithm.name == "ppo":
        return runtime.save(out, *export_ppo(networks, policy.params, policy.version))
    export = export_ddpg if algorithm.module is ddpg else export_sac
    return runtime.save(out, *export(networks, policy.params, algorithm.config, policy.version))


def export_sac(networks: sac.SACNetworks, actor_params, config: sac.SACConfig,
               version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of SAC's policy: its mean action, and samples of its squashed Gaussian."""
    actor = nnx.merge(networks.actor_graph, _body(networks, actor_params))
    if type(actor) is not MLP or actor.norms is not None:
        raise NotImplementedError("export covers the plain MLP actor")
    arrays = flat_params.flatten({"actor": jax.device_get(actor_params)})
    n_layers = len(actor.layers)
    graph, prefix = _inputs(networks, actor_params)
    for i in range(n_layers):
        graph.append({"op": "dense", "kernel": f"{prefix}/layers/{i}/kernel", "bias": f"{prefix}/layers/{i}/bias"})
        if i < n_layers - 1:
            graph.append({"op": "relu"})
    graph += [{"op": "gaussian_head", "log_std_min": networks.log_std_min, "log_std_max": networks.log_std_max},
              {"op": "tanh"}, {"op": "scale", "center": "scale/center", "half_range": "scale/half_range"}]
    arrays["scale/center"] = np.asarray(networks.scale.center, np.float32)
    arrays["scale/half_range"] = np.asarray(networks.scale.half_range, np.float32)
    meta = {"format": runtime.FORMAT, "format_version": runtime.FORMAT_VERSION, "algo": "sac",
            "policy_version": list(version),
            "observation_spec": networks.observation_spec.to_msg(),
            "action_spec": networks.action_spec.to_msg(),
            "exploration": {"kind": "squashed_gaussian"}, "graph": graph}
    return meta, {k: np.asarray(v, np.float32) for k, v in arrays.items()}


def export_ppo(networks, actor_params, version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of PPO's policy (:mod:`embodyrl.algos.ppo`): the MLP's tanh mean plus noise of its
    learned ``log_std`` then the action scale (Gaussian), or its logits sampled or maxed (categorical).
    ``actor_params`` as published: ``{"policy": ..., "log_std": ...}``; the runtime returns the
    sample's log-probability, so a numpy actor can feed asynchronous PPO."""
    policy = nnx.merge(networks.policy_graph, actor_params["policy"])
    if type(policy) is not MLP or policy.norms is not None:
        raise NotImplementedError("export covers the plain MLP policy")
    arrays = flat_params.flatten({"actor": jax.device_get(actor_params)})
    n_layers = len(policy.layers)
    graph: list[dict] = [{"op": "concat", "fields": list(networks.observation_spec)}]
    for i in range(n_layers):
        graph.append({"op": "dense", "kernel": f"actor/policy/layers/{i}/kernel",
                      "bias": f"actor/policy/layers/{i}/bias"})
        if i < n_layers - 1:
            graph.append({"op": "relu"})
    if networks.discrete:
        graph.append({"op": "categorical"})
    else:
        graph += [{"op": "tanh"}, {"op": "gaussian_noise", "log_std": "actor/log_std"},
                  {"op": "scale", "center": "scale/center", "half_range": "scale/half_range"}]
        arrays["scale/center"] = np.asarray(networks.scale.center, np.float32)
        arrays["scale/half_range"] = np.asarray(networks.scale.half_range, np.float32)
    meta = {"format": runtime.FORMAT, "format_version": runtime.FORMAT_VERSION, "algo": "ppo",
            "policy_version": list(version),
            "observation_spec": networks.observation_spec.to_msg(),
            "action_spec": networks.action_spec.to_msg(),
            "exploration": {"kind": "sampled"}, "graph": graph}
    return meta, {k: np.asarray(v, np.float32) for k, v in arrays.items()}


def export_dqn(networks, params, epsilon: float = 0.0,
               version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of a DQN's greedy policy (:mod:`embodyrl.algos.dqn`): the Q-network's MLP, then
    the best action; exploring, a uniform action with probability ``epsilon``."""
    q = nnx.merge(networks.graph, params)
    if type(q) is not MLP or q.norms is not None:
        raise NotImplementedError("export covers the plain MLP Q-network")
    arrays = flat_params.flatten({"actor": jax.device_get(params)})
    n_layers = len(q.layers)
    graph: list[dict] = [{"op": "concat", "fields": list(networks.observation_spec)}]
    for i in range(n_layers):
        graph.append({"op": "dense", "kernel": f"actor/layers/{i}/kernel", "bias": f"actor/layers/{i}/bias"})
        if i < n_layers - 1:
            graph.append({"op": "relu"})
    graph.append({"op": "argmax"})
    meta = {"format": runtime.FORMAT, "format_version": runtime.FORMAT_VERSION, "algo": "dqn",
            "policy_version": list(version),
            "observation_spec": networks.observation_spec.to_msg(),
            "action_spec": networks.action_spec.to_msg(),
            "exploration": {"kind": "epsilon_greedy", "epsilon": float(epsilon)}, "graph": graph}
    return meta, {k: np.asarray(v, np.float32) for k, v in arrays.items()}


def export_device(algorithm, actor_params, device_id: int,
                  version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of one device's policy in a heterogeneous run (:mod:`embodyrl.algos.heads`).

    ``algorithm``: the run's ``HeteroOffPolicy`` (DDPG/TD3 or SAC/RLPD). The device's input
    head, the shared trunk and its output head form a plain MLP on the device's own
    observation and action specs, with no padding. The arrays keep the published names
    (``actor/inputs/<id>/kernel``...), so the export follows the learner's weights.
    """
    layout = algorithm.layout
    if not 0 <= device_id < len(layout.kinds):
        raise ValueError(f"device id {device_id}: the layout declares {len(layout.kinds)} kinds")
    kind = layout.kinds[device_id]
    layers = [f"actor/inputs/{device_id}"] + [f"actor/trunk/{i}" for i in range(len(actor_params["trunk"]))] \
        + [f"actor/outputs/{device_id}"]
    graph: list[dict] = [{"op": "concat", "fields": list(kind.observation_spec)}]
    for i, name in enumerate(layers):
        graph.append({"op": "dense", "kernel": f"{name}/kernel", "bias": f"{name}/bias"})
        if i < len(layers) - 1:
            graph.append({"op": "relu"})
    if algorithm.module is ddpg:
        graph.append({"op": "tanh"})
        exploration = {"kind": "gaussian", "std": float(algorithm.config.exploration_noise)}
    else:
        graph += [{"op": "gaussian_head", "log_std_min": algorithm.config.log_std_min,
                   "log_std_max": algorithm.config.log_std_max}, {"op": "tanh"}]
        exploration = {"kind": "squashed_gaussian"}
    graph.append({"op": "scale", "center": "scale/center", "half_range": "scale/half_range"})
    published = flat_params.flatten({"actor": jax.device_get(actor_params)})
    arrays = {n: published[n] for name in layers for n in (f"{name}/kernel", f"{name}/bias")}
    scale = ActionScale(kind.action_spec)
    arrays["scale/center"], arrays["scale/half_range"] = scale.center, scale.half_range
    meta = {"format": runtime.FORMAT, "format_version": runtime.FORMAT_VERSION,
            "algo": "sac" if algorithm.module is sac else "ddpg", "policy_version": list(version),
            "device": {"id": device_id, "kind": kind.name},
            "observation_spec": kind.observation_spec.to_msg(), "action_spec": kind.action_spec.to_msg(),
            "exploration": exploration, "graph": graph}
    return meta, {k: np.asarray(v, np.float32) for k, v in arrays.items()}
