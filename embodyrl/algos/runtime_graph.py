"""The pieces every algorithm's numpy-runtime export is built from (format: :mod:`embodyrl.hal.runtime`).

An export is ``(meta, arrays)``: ``meta`` names the format, the algorithm
family (``algo``), the policy version, the specs, the exploration and the
``graph`` of ops; ``arrays`` maps the learner's published weight names
(``actor/layers/0/kernel``...) to float32 arrays, so a numpy actor that
loaded an export follows the learner's WEIGHTS messages. Each algorithm
package writes its own export from these pieces; DDPG's and SAC's bounded
actors share :func:`bounded_policy`, and one device of a heterogeneous run
(its input head, the trunk, its output head: a plain MLP on the device's own
specs) is :func:`device_policy` with the same :class:`PolicyHead`.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from flax import nnx

from ..hal import params as flat_params
from ..hal import runtime
from ..hal.steps import NO_POLICY, PolicyVersion
from .encoders import export_ops
from .networks import MLP, ActionScale

SCALE = {"op": "scale", "center": "scale/center", "half_range": "scale/half_range"}
"""Unit actions to the action bounds, from the arrays :func:`scale_arrays` writes."""


@dataclass(frozen=True)
class PolicyHead:
    """What follows a bounded actor's MLP: the ops before the scale, the exploration, the family."""

    algo: str
    """The export's ``algo``: the family (``ddpg`` for DDPG and TD3)."""
    ops: tuple[dict, ...]
    exploration: dict


def concat(observation_spec) -> dict:
    """The flat observation: its fields in the spec's order."""
    return {"op": "concat", "fields": list(observation_spec)}


def dense_relu(layers: list[str], norms: list[dict] | None = None) -> list[dict]:
    """Dense layers by array prefix, ReLU between them (after ``norms[i]``, the i-th hidden layer's
    ``layer_norm`` op, where given); the last stays linear (as :class:`MLP`)."""
    ops: list[dict] = []
    for i, name in enumerate(layers):
        ops.append({"op": "dense", "kernel": f"{name}/kernel", "bias": f"{name}/bias"})
        if i < len(layers) - 1:
            ops += [norms[i], {"op": "relu"}] if norms else [{"op": "relu"}]
    return ops


def mlp_ops(graph: nnx.GraphDef, params, prefix: str, what: str) -> list[dict]:
    """An :class:`MLP`'s ops by array prefix: dense layers, ReLU between them (after a LayerNorm where
    the MLP has them), the last layer linear; other modules are refused by name."""
    module = nnx.merge(graph, params)
    if type(module) is not MLP:
        raise NotImplementedError(f"export covers the MLP {what}, not {type(module).__name__}")
    norms = None if module.norms is None else [
        {"op": "layer_norm", "scale": f"{prefix}/norms/{i}/scale", "bias": f"{prefix}/norms/{i}/bias",
         "epsilon": float(norm.epsilon)} for i, norm in enumerate(module.norms)]
    return dense_relu([f"{prefix}/layers/{i}" for i in range(len(module.layers))], norms)


def published(actor_params) -> dict[str, np.ndarray]:
    """The actor's arrays under the names the learner publishes them by."""
    return flat_params.flatten({"actor": jax.device_get(actor_params)})


def scale_arrays(scale: ActionScale) -> dict[str, np.ndarray]:
    return {"scale/center": np.asarray(scale.center, np.float32),
            "scale/half_range": np.asarray(scale.half_range, np.float32)}


def finish(algo: str, version: PolicyVersion, observation_spec, action_spec, exploration: dict,
           graph: list[dict], arrays: dict, device: dict | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, float32 arrays): the export as :func:`embodyrl.hal.runtime.save` writes it."""
    meta = {"format": runtime.FORMAT, "format_version": runtime.FORMAT_VERSION, "algo": algo,
            "policy_version": list(version)}
    if device is not None:
        meta["device"] = device
    meta.update(observation_spec=observation_spec.to_msg(), action_spec=action_spec.to_msg(),
                exploration=exploration, graph=graph)
    return meta, {k: np.asarray(v, np.float32) for k, v in arrays.items()}


def bounded_graph(head: PolicyHead, graph: list[dict], scale: ActionScale, arrays: dict, version: PolicyVersion,
             observation_spec, action_spec, device: dict | None = None):
    """``graph`` (the actor up to its output), then ``head``'s ops and the action bounds."""
    return finish(head.algo, version, observation_spec, action_spec, head.exploration,
                  [*graph, *head.ops, SCALE], {**arrays, **scale_arrays(scale)}, device)


def bounded_policy(networks, actor_params, head: PolicyHead,
                   version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """A DDPG- or SAC-style actor: the fields it reads (flat, or through the image encoder), the MLP,
    ``head``, then the action bounds. The meta declares the whole observation the device sends; the
    graph names only ``networks.inputs`` (an ignored field is sent and never read)."""
    if networks.encoder is None:
        inputs, prefix, body = [concat(networks.inputs)], "actor", actor_params
    else:  # the encoder's ops, then the MLP's parameters under ``policy``
        inputs = export_ops(networks.encoder, actor_params["encoder"], "actor/encoder")
        prefix, body = "actor/policy", actor_params["policy"]
    return bounded_graph(head, inputs + mlp_ops(networks.actor_graph, body, prefix, "actor"), networks.scale,
                         published(actor_params), version, networks.observation_spec, networks.action_spec)


def device_policy(layout, actor_params, device_id: int, head: PolicyHead,
                  version: PolicyVersion = NO_POLICY) -> tuple[dict, dict[str, np.ndarray]]:
    """One device's policy in a heterogeneous run (:mod:`embodyrl.algos.heads`): its input head, the
    shared trunk and its output head, a plain MLP on the device's own specs with no padding. The
    arrays keep their published names (``actor/inputs/<id>/kernel``...)."""
    if not 0 <= device_id < len(layout.kinds):
        raise ValueError(f"device id {device_id}: the layout declares {len(layout.kinds)} kinds")
    kind = layout.kinds[device_id]
    layers = [f"actor/inputs/{device_id}", *(f"actor/trunk/{i}" for i in range(len(actor_params["trunk"]))),
              f"actor/outputs/{device_id}"]
    every = published(actor_params)
    arrays = {n: every[n] for name in layers for n in (f"{name}/kernel", f"{name}/bias")}
    return bounded_graph(head, [concat(kind.observation_spec), *dense_relu(layers)], ActionScale(kind.action_spec),
                    arrays, version, kind.observation_spec, kind.action_spec,
                    device={"id": device_id, "kind": kind.name})
