"""A learner's policy as a numpy-only forward pass: acting without JAX.

An actor on a small robot PC, or an MPI rank of a scientific model, loads an
export written by :mod:`embodyrl.cli.export` and acts with numpy alone. The
export format (version 1) is two files with the same stem:

``policy.json``::

    {"format": "embodyrl.policy", "format_version": 1, "algo": "ddpg",
     "policy_version": [incarnation, count],
     "observation_spec": [...], "action_spec": {...},      # as on the wire
     "exploration": {"kind": "gaussian", "std": 0.1},      # std in half action ranges
     "graph": [                                            # applied in order
        {"op": "concat", "fields": ["angular_velocity", "orientation"]},
        {"op": "dense", "kernel": "actor/layers/0/kernel", "bias": "actor/layers/0/bias"},
        {"op": "relu"},
        ...
        {"op": "tanh"},
        {"op": "scale", "center": "scale/center", "half_range": "scale/half_range"}]}

``policy.npz``: the arrays the graph names (flat ``name -> array``, float32,
loaded with ``allow_pickle=False``). ``concat`` flattens each named
observation field to float32 and concatenates them; ``dense`` is ``x @ kernel
+ bias`` (kernel ``[in, out]``); ``scale`` maps [-1, 1] to ``center +
half_range * x``. ``gaussian_noise`` adds ``exp(log_std) * N(0, 1)`` (a
learned ``log_std`` array) when sampling, and ``categorical`` turns logits
into a sampled or the most likely integer action (PPO); ``argmax`` takes
the best of the values (DQN, explored epsilon-greedily). ``gaussian_noise``,
``categorical`` and ``gaussian_head`` (SAC's: a sample's ``tanh`` and
``scale`` then change its density) give the action's log-probability,
returned as ``log_prob`` by :meth:`NumpyPolicy.act` where the JAX policy
returns one: a sample's when exploring, and PPO's mode otherwise. Weight names are the learner's (``actor/...``), so
:meth:`NumpyPolicy.load_weights` follows the weights it publishes. A new
network extends ``OPS`` and passes the same parity test against JAX.

The ops are evaluated by one :class:`Graph`, which the policy wraps with its
action and exploration and a success classifier (:mod:`embodyrl.hal.classifier`,
a graph ending in one logit) with its sigmoid and threshold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import msgpack
import numpy as np

from .specs import ArraySpec, DictSpec
from .steps import NO_POLICY, PolicyVersion

FORMAT = "embodyrl.policy"
FORMAT_VERSION = 1


def with_products(x: np.ndarray) -> np.ndarray:
    """``x`` [..., n] with every product x_i x_j (i <= j) appended: [..., n + n (n + 1) / 2]."""
    i, j = np.triu_indices(x.shape[-1])
    return np.concatenate([x, x[..., i] * x[..., j]], axis=-1)


class ExportError(ValueError):
    """An export (graph or arrays) is malformed; the message names the op or array."""


OPS = ("concat", "dense", "relu", "tanh", "scale", "gaussian_head", "gaussian_noise", "categorical", "argmax",
       "image", "conv2d", "flatten", "layer_norm", "append", "batch_norm", "products")
# Pixels (the conv encoder of embodyrl.algos.encoders): ``image`` stacks uint8 HxWxC fields on the
# channel axis as float32 in [0, 1]; ``conv2d`` is a VALID convolution (kernel [kh, kw, in, out],
# ``stride``); ``flatten`` joins H, W, C; ``layer_norm`` normalises the last axis (``epsilon``,
# ``scale``, ``bias``); ``append`` concatenates flattened state fields after the features.
# ``batch_norm`` normalises each feature by a network's running moments (``mean``, ``var``,
# ``epsilon``), then ``scale`` and ``bias`` (CrossQ's batch-renormalised actor, as it acts).
# ``products`` appends every product x_i x_j (i <= j, in numpy's ``triu_indices`` order) to the
# features: a dense op after it is a polynomial of degree 2 (an offline baseline's export).
FIRST_OPS = ("concat", "image")
ACTION_OPS = ("scale", "categorical", "argmax")
"""Ops that read the action spec: a graph without one (a classifier's) refuses them."""
EXPLORATION = ("gaussian", "squashed_gaussian", "sampled", "epsilon_greedy")
"""gaussian: noise of ``std`` half ranges on the action (DDPG); squashed_gaussian and sampled: the
graph's own sample (SAC, PPO); epsilon_greedy: a uniform action with probability ``epsilon`` (DQN)."""
LOG_STD_BOUNDS = ("tanh", "clip")
"""How ``gaussian_head`` holds its raw log std in [log_std_min, log_std_max] (an export without
``log_std_bounds`` means tanh)."""


def bounded_log_std(raw, low: float, high: float, bounds: str, xp=np):
    """``raw`` held in [low, high]: clipped, or a tanh rescaled into the range. ``xp`` is numpy here
    and ``jax.numpy`` in the learner, so both compute the one formula."""
    if bounds == "clip":
        return xp.clip(raw, low, high)
    return low + 0.5 * (high - low) * (xp.tanh(raw) + 1.0)


class Graph:
    """A checked list of ops over named float32 arrays: the forward pass every export shares.

    A policy (:class:`NumpyPolicy`) and a success classifier
    (:mod:`embodyrl.hal.classifier`) are each a graph plus what they do with its output::

        graph = Graph(ops, observation_spec, action_spec)    # ops checked: names, fields
        arrays, width = graph.checked_arrays(arrays)           # shapes checked; width of the output
        x, log_prob = graph.run(arrays, observation, sample=False, rng=rng)

    ``action_spec`` is what ``scale``, ``categorical`` and ``argmax`` read (a policy's); a graph
    without one (a classifier's logit) refuses those ops by name.
    """

    def __init__(self, ops, observation_spec: DictSpec, action_spec: ArraySpec | None = None):
        self.ops = list(ops)
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self._check()

    def names(self) -> dict[str, str]:
        """Array name -> the role it plays, for every array the graph reads."""
        names = {}
        for op in self.ops:
            for role in ("kernel", "bias", "center", "half_range", "log_std", "scale", "mean", "var"):
                if role in op:
                    names[op[role]] = role
        return names

    def _check(self) -> None:
        for i, op in enumerate(self.ops):
            if not isinstance(op, Mapping) or op.get("op") not in OPS:
                raise ExportError(f"graph op {i}: {op!r} is not one of {OPS}")
        if not self.ops or self.ops[0]["op"] not in FIRST_OPS:
            raise ExportError("graph must start with a concat (or image) of observation fields")
        for op in self.ops:
            unknown = [f for f in op.get("fields", ()) if f not in self.observation_spec]
            if unknown:
                raise ExportError(f"{op['op']} reads fields {unknown} missing from the observation spec")
            if self.action_spec is None and op["op"] in ACTION_OPS:
                raise ExportError(f"{op['op']}: an op of a policy's action; this graph has no action spec")

    def checked_arrays(self, arrays: Mapping[str, np.ndarray],
                       require_all: bool = True) -> tuple[dict[str, np.ndarray], int]:
        """(the arrays the graph reads, as float32; the width of its output), every shape checked
        against the op that reads it; :class:`ExportError` naming the array otherwise."""
        needed = self.names()
        missing = sorted(n for n in needed if n not in arrays)
        if require_all and missing:
            raise ExportError(f"weights lack arrays {missing}")
        out = {n: np.asarray(arrays[n], np.float32) for n in needed if n in arrays}
        width = sum(self.observation_spec[f].size for f in self.ops[0]["fields"])
        image = None  # (H, W, C) while the graph holds images
        for op in self.ops:
            if op["op"] == "image":
                shapes = [self.observation_spec[f].shape for f in op["fields"]]
                if any(len(s) != 3 or s[:2] != shapes[0][:2] for s in shapes):
                    raise ExportError(f"image: fields {op['fields']} are not HxWxC of one size: {shapes}")
                image = (*shapes[0][:2], sum(s[2] for s in shapes))
            elif op["op"] == "conv2d":
                kernel, bias = out[op["kernel"]], out[op["bias"]]
                if image is None or kernel.ndim != 4 or kernel.shape[2] != image[2] or bias.shape != kernel.shape[3:]:
                    raise ExportError(f"{op['kernel']}: shape {kernel.shape} (bias {bias.shape}) does not take "
                                      f"images {image}")
                stride = int(op["stride"])
                image = ((image[0] - kernel.shape[0]) // stride + 1, (image[1] - kernel.shape[1]) // stride + 1,
                         kernel.shape[3])
            elif op["op"] == "flatten":
                if image is None:
                    raise ExportError("flatten: no images to flatten")
                width, image = image[0] * image[1] * image[2], None
            elif op["op"] == "layer_norm":
                for role in ("scale", "bias"):
                    if out[op[role]].shape != (width,):
                        raise ExportError(f"{op[role]}: shape {out[op[role]].shape}; expected ({width},)")
            elif op["op"] == "batch_norm":
                for role in ("mean", "var", "scale", "bias"):
                    if out[op[role]].shape != (width,):
                        raise ExportError(f"{op[role]}: shape {out[op[role]].shape}; expected ({width},)")
                if (out[op["var"]] < 0).any() or not float(op["epsilon"]) > 0:
                    raise ExportError(f"{op['var']}: a variance below 0, or epsilon {op['epsilon']} not above 0")
            elif op["op"] == "append":
                width += sum(self.observation_spec[f].size for f in op["fields"])
            elif op["op"] == "products":
                width += width * (width + 1) // 2
            elif op["op"] == "dense":
                kernel, bias = out[op["kernel"]], out[op["bias"]]
                if kernel.ndim != 2 or kernel.shape[0] != width or bias.shape != (kernel.shape[1],):
                    raise ExportError(f"{op['kernel']}: shape {kernel.shape} (bias {bias.shape}) does not "
                                      f"take {width} inputs")
                width = kernel.shape[1]
            elif op["op"] == "gaussian_head":
                if width % 2:
                    raise ExportError(f"gaussian_head splits {width} values into mean and log std")
                if op.get("log_std_bounds", "tanh") not in LOG_STD_BOUNDS:
                    raise ExportError(f"gaussian_head: log_std_bounds {op['log_std_bounds']!r} is not one of "
                                      f"{LOG_STD_BOUNDS}")
                width //= 2
            elif op["op"] in ("categorical", "argmax"):
                if self.action_spec.dtype.kind not in "iu" or self.action_spec.shape != ():
                    raise ExportError(f"{op['op']}: needs a scalar integer action, not {self.action_spec.dtype}"
                                      f"{self.action_spec.shape}")
                width = 1
            elif op["op"] == "gaussian_noise":
                if out[op["log_std"]].shape != (width,):
                    raise ExportError(f"{op['log_std']}: shape {out[op['log_std']].shape}; expected ({width},)")
            elif op["op"] == "scale":
                for role in ("center", "half_range"):
                    if out[op[role]].shape != self.action_spec.shape:
                        raise ExportError(f"{op[role]}: shape {out[op[role]].shape} is not the action's")
        if image is not None:
            raise ExportError("the graph ends on images: flatten them")
        for name, value in out.items():
            if not np.isfinite(value).all():
                raise ExportError(f"{name}: non-finite values")
        return out, width

    def _fields(self, observation: Mapping[str, np.ndarray], names: list[str], flat: bool) -> list[np.ndarray]:
        parts = []
        for name in names:
            if name not in observation:
                raise KeyError(f"observation lacks field {name!r} (the graph reads {names})")
            value = np.asarray(observation[name], np.float32)
            if flat:
                spec = self.observation_spec[name]
                value = value.reshape(*value.shape[: value.ndim - len(spec.shape)], spec.size)
            parts.append(value)
        return parts

    def run(self, arrays: Mapping[str, np.ndarray], observation: Mapping[str, np.ndarray], *,
            sample: bool = False, rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """(output, log-probability of a sample or None) of ``observation`` (fields may carry
        leading batch dimensions) through the graph; ``rng`` draws the samples."""
        x, log_prob = None, None
        for op in self.ops:
            kind = op["op"]
            if kind == "concat":
                x = np.concatenate(self._fields(observation, op["fields"], flat=True), axis=-1)
            elif kind == "image":
                x = np.concatenate(self._fields(observation, op["fields"], flat=False), -1) / 255.0
            elif kind == "conv2d":
                x = _conv2d(x, arrays[op["kernel"]], arrays[op["bias"]], int(op["stride"]))
            elif kind == "flatten":
                x = x.reshape(*x.shape[:-3], -1)
            elif kind == "layer_norm":
                mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
                x = (x - mean) / np.sqrt(var + float(op["epsilon"])) * arrays[op["scale"]] + arrays[op["bias"]]
            elif kind == "batch_norm":
                x = ((x - arrays[op["mean"]]) / np.sqrt(arrays[op["var"]] + float(op["epsilon"])) * arrays[op["scale"]]
                     + arrays[op["bias"]])
            elif kind == "append":
                x = np.concatenate([x, *self._fields(observation, op["fields"], flat=True)], axis=-1)
            elif kind == "products":
                x = with_products(x)
            elif kind == "dense":
                x = x @ arrays[op["kernel"]] + arrays[op["bias"]]
            elif kind == "relu":
                x = np.maximum(x, 0.0)
            elif kind == "tanh":
                if log_prob is not None:  # a sample squashed: log(1 - tanh(u)^2), written stably
                    log_prob = log_prob - np.sum(2.0 * (np.log(2.0) - x - np.logaddexp(0.0, -2.0 * x)), axis=-1)
                x = np.tanh(x)
            elif kind == "scale":
                x = x * arrays[op["half_range"]] + arrays[op["center"]]
                if log_prob is not None:  # the density in environment units
                    log_prob = log_prob - np.sum(np.log(arrays[op["half_range"]]))
            elif kind == "gaussian_noise":  # a learned state-independent std, in the units so far
                log_std = arrays[op["log_std"]]
                z = rng.normal(size=x.shape) if sample else np.zeros_like(x)
                x = x + np.exp(log_std) * z
                log_prob = np.sum(-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)
            elif kind in ("categorical", "argmax"):  # logits (or values) -> an integer action
                if kind == "categorical" and sample:
                    shifted = x - x.max(axis=-1, keepdims=True)
                    probs = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
                    flat = probs.reshape(-1, probs.shape[-1])
                    choice = np.array([rng.choice(len(p), p=p / p.sum()) for p in flat]).reshape(probs.shape[:-1])
                else:
                    choice = np.argmax(x, axis=-1)
                if kind == "categorical":
                    logits = x - x.max(axis=-1, keepdims=True)
                    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
                    log_prob = np.take_along_axis(logp, choice[..., None], -1)[..., 0]
                x = choice + int(self.action_spec.minimum)
            elif kind == "gaussian_head":  # [mean, raw log std] -> the mean, or a sample
                mean, raw = np.split(x, 2, axis=-1)
                lo, hi = float(op["log_std_min"]), float(op["log_std_max"])
                x = mean
                if sample:
                    log_std = bounded_log_std(raw, lo, hi, op.get("log_std_bounds", "tanh"))
                    z = rng.normal(size=mean.shape)
                    x = mean + np.exp(log_std) * z
                    log_prob = np.sum(-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)
        return x, log_prob


class NumpyPolicy:
    """Implements the HAL :class:`~embodyrl.hal.policy.Policy` with numpy: a :class:`Graph` from the
    observation to the action, and exploration."""

    def __init__(self, graph: Mapping, arrays: Mapping[str, np.ndarray], seed: int | None = None):
        if graph.get("format") != FORMAT or graph.get("format_version") != FORMAT_VERSION:
            raise ExportError(f"not an {FORMAT} v{FORMAT_VERSION} export: format "
                              f"{graph.get('format')!r} v{graph.get('format_version')!r}")
        self.graph = dict(graph)
        self.observation_spec = DictSpec.from_msg(graph["observation_spec"])
        self.action_spec = ArraySpec.from_msg(graph["action_spec"])
        exploration = graph.get("exploration", {"kind": "gaussian", "std": 0.0})
        self.exploration_kind = exploration.get("kind")
        if self.exploration_kind not in EXPLORATION:
            raise ExportError(f"exploration kind {self.exploration_kind!r} is not one of {EXPLORATION}")
        self.exploration_std = float(exploration.get("std", 0.0))
        self.epsilon = float(exploration.get("epsilon", 0.0))
        self.network = Graph(graph["graph"], self.observation_spec, self.action_spec)
        self.ops = self.network.ops
        self.arrays = self._checked_arrays(arrays, require_all=True)
        self.version = PolicyVersion(*graph.get("policy_version", NO_POLICY))
        self.rng = np.random.default_rng(seed)

    # -- the Policy protocol ----------------------------------------------
    def act(self, observation: Mapping[str, np.ndarray], *, explore: bool = True) -> tuple[np.ndarray, dict]:
        """mu(o), plus noise from this policy's own RNG when exploring, clipped: Gaussian on
        the action (DDPG), or a sample of the squashed Gaussian the network outputs (SAC)."""
        if explore and self.exploration_kind in ("squashed_gaussian", "sampled"):
            action, log_prob = self._run(observation, sample=True)
            extras = {} if log_prob is None else {"log_prob": float(np.sum(log_prob))}
            return self.action_spec.clip(action), extras
        if explore and self.exploration_kind == "epsilon_greedy" and self.rng.random() < self.epsilon:
            spec = self.action_spec  # integers: every action equally likely, the maximum included
            return np.asarray(self.rng.integers(int(spec.minimum), int(spec.maximum) + 1), spec.dtype), {}
        action, log_prob = self._run(observation, sample=False)
        if not explore and log_prob is not None:  # the mode's, as the JAX policy gives it (PPO)
            return self.action_spec.clip(action), {"log_prob": float(np.sum(log_prob))}
        if explore and self.exploration_std > 0:
            half_range = (self.action_spec.maximum - self.action_spec.minimum) / 2
            action = action + self.rng.normal(0.0, self.exploration_std, action.shape) * half_range
        return self.action_spec.clip(action), {}

    def load_weights(self, version: PolicyVersion, arrays: Mapping[str, np.ndarray]) -> None:
        """Take the learner's published weights: every ``actor/...`` array the graph reads
        must be there (others, like the action scale, stay from the export; extra names
        are ignored). Nothing changes unless all of them fit."""
        missing = sorted(n for n in self._names() if n.startswith("actor/") and n not in arrays)
        if missing:
            raise ExportError(f"published weights lack arrays {missing}")
        merged = {**self.arrays, **{n: arrays[n] for n in self._names() if n in arrays}}
        self.arrays = self._checked_arrays(merged, require_all=True)
        self.version = PolicyVersion(*version)

    # -- the forward pass --------------------------------------------------
    def mean_action(self, observation: Mapping[str, np.ndarray]) -> np.ndarray:
        """The deterministic action; fields may carry leading batch dimensions."""
        return self._run(observation, sample=False)[0]

    def _run(self, observation: Mapping[str, np.ndarray], sample: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(action, log-probability of a sample or None) through the graph."""
        x, log_prob = self.network.run(self.arrays, observation, sample=sample, rng=self.rng)
        return x.astype(self.action_spec.dtype, copy=False), log_prob

    # -- validation ----------------------------------------------------------
    def _names(self) -> dict[str, str]:
        return self.network.names()

    def _checked_arrays(self, arrays: Mapping[str, np.ndarray], require_all: bool) -> dict[str, np.ndarray]:
        out, width = self.network.checked_arrays(arrays, require_all)
        if width != self.action_spec.size:
            raise ExportError(f"the graph outputs {width} values; the action has {self.action_spec.size}")
        return out


def _conv2d(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """VALID 2-D convolution of [..., H, W, C] with ``kernel`` [kh, kw, C, out].

    A sum over the kh*kw taps of (strided view) @ kernel[i, j]: small products that
    stay on one thread. One im2col matmul is as fast alone but lets a threaded BLAS
    spin up its pool, 5-10x slower beside a busy learner; an einsum over sliding
    windows was 10-25x slower (``embodyrl bench pixels`` times it as the baseline).
    """
    lead, (height, width, channels) = x.shape[:-3], x.shape[-3:]
    kh, kw, _, out_channels = kernel.shape
    x = x.reshape(-1, height, width, channels)
    out_h, out_w = (height - kh) // stride + 1, (width - kw) // stride + 1
    out = np.empty((x.shape[0], out_h, out_w, out_channels), np.result_type(x, kernel, bias))
    out[...] = bias
    for i in range(kh):
        for j in range(kw):
            out += x[:, i:i + stride * (out_h - 1) + 1:stride, j:j + stride * (out_w - 1) + 1:stride] @ kernel[i, j]
    return out.reshape(*lead, out_h, out_w, out_channels)


def save(path: str | Path, graph: Mapping, arrays: Mapping[str, np.ndarray],
         packed: bool = False) -> tuple[Path, Path]:
    """Write ``<path>.json`` and ``<path>.npz`` (no pickle); with ``packed``, also ``<path>.msgpack``:
    the same graph and arrays in one msgpack map ``{"graph": ..., "arrays": {name: {"dtype",
    "shape", "data"}}}`` (little-endian float32 bytes), which a C or Fortran model reads with a
    msgpack library instead of a JSON parser and a zip reader (``hal/coupling/c``)."""
    NumpyPolicy(graph, arrays)  # refuse to write what cannot be loaded
    stem = Path(path).with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path, npz_path = stem.with_suffix(".json"), stem.with_suffix(".npz")
    json_path.write_text(json.dumps(graph, indent=1) + "\n")
    np.savez(npz_path, **{k: np.asarray(v, np.float32) for k, v in arrays.items()})
    if packed:
        flat = {k: np.ascontiguousarray(v, np.dtype("<f4")) for k, v in arrays.items()}
        data = msgpack.packb({"graph": dict(graph), "arrays": {
            k: {"dtype": "float32", "shape": list(v.shape), "data": v.tobytes()} for k, v in flat.items()}},
            use_bin_type=True)
        partial = stem.with_suffix(".msgpack.partial")
        partial.write_bytes(data)
        partial.replace(stem.with_suffix(".msgpack"))
    return json_path, npz_path


def load_packed(path: str | Path, seed: int | None = None) -> NumpyPolicy:
    """Read the ``.msgpack`` export :func:`save` writes with ``packed`` (no pickle)."""
    try:
        root = msgpack.unpackb(Path(path).with_suffix(".msgpack").read_bytes(), raw=False)
        arrays = {k: np.frombuffer(v["data"], np.dtype("<f4")).reshape(v["shape"])
                  for k, v in root["arrays"].items()}
        graph = root["graph"]
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as err:
        raise ExportError(f"{path}: not a packed embodyrl.policy export ({err})") from None
    return NumpyPolicy(graph, arrays, seed)


def load(path: str | Path, seed: int | None = None) -> NumpyPolicy:
    """Read an export written by :func:`save` (``path`` with or without suffix)."""
    stem = Path(path).with_suffix("")
    try:
        graph = json.loads(stem.with_suffix(".json").read_text())
    except json.JSONDecodeError as err:
        raise ExportError(f"{stem.with_suffix('.json')}: not JSON ({err})") from err
    with np.load(stem.with_suffix(".npz"), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return NumpyPolicy(graph, arrays, seed)
