"""CrossQ's networks: MLPs with batch renormalisation (Ioffe 2017) at the input and after each hidden
layer, as pure functions over pytrees.

A network's trainable parameters are ``{"layers": {i: {kernel, bias}}, "norms": {i: {scale, bias}}}``
and its statistics ``{"norms": {i: {mean, var}}, "count"}``: the running moments and the number of
training passes (which ends the renormalisation's warm-up). Acting reads the running moments; a
training pass normalises with the batch's own and moves the running ones. The actor's published
parameters (:func:`acting`) join the two, so the numpy runtime has everything it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ...hal.runtime import bounded_log_std
from ...hal.specs import ArraySpec, DictSpec
from ..encoder_config import EncoderConfig
from ..encoders import image_fields, network_inputs
from ..networks import ActionScale, flatten_observation, observation_size, squashed_gaussian
from .config import CrossQConfig


@dataclass(frozen=True)
class Norm:
    """Batch renormalisation's settings (one per network)."""

    momentum: float
    epsilon: float
    warmup: int
    r_max: float
    d_max: float

    @classmethod
    def of(cls, config: CrossQConfig) -> Norm:
        return cls(config.batch_norm_momentum, config.batch_norm_epsilon, config.renorm_warmup_steps,
                   config.renorm_r_max, config.renorm_d_max)


def init_mlp(key: jax.Array, sizes: list[int], normed: bool) -> tuple[dict, dict]:
    """(params, stats) of an MLP through ``sizes`` (input, hidden..., output); with ``normed``, a norm
    before the first layer and after each hidden ReLU (scale 1, bias 0, running mean 0, var 1)."""
    init = jax.nn.initializers.lecun_normal()
    keys = jax.random.split(key, len(sizes) - 1)
    layers = {i: {"kernel": init(k, (a, b), jnp.float32), "bias": jnp.zeros((b,), jnp.float32)}
              for i, (k, a, b) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=True))}
    widths = sizes[:-1] if normed else []
    norms = {i: {"scale": jnp.ones((w,), jnp.float32), "bias": jnp.zeros((w,), jnp.float32)}
             for i, w in enumerate(widths)}
    moments = {i: {"mean": jnp.zeros((w,), jnp.float32), "var": jnp.ones((w,), jnp.float32)}
               for i, w in enumerate(widths)}
    return {"layers": layers, "norms": norms}, {"norms": moments, "count": jnp.zeros((), jnp.int32)}


def _renorm(x, scale, bias, moments, count, norm: Norm, train: bool):
    """(normalised x, new moments). Training: the batch's moments during the warm-up, then corrected
    towards the running ones by r and d clipped to r_max and d_max (no gradient through either)."""
    if not train:
        return (x - moments["mean"]) / jnp.sqrt(moments["var"] + norm.epsilon) * scale + bias, moments
    axes = tuple(range(x.ndim - 1))
    mean, var = jnp.mean(x, axes), jnp.var(x, axes)
    std, running_std = jnp.sqrt(var + norm.epsilon), jnp.sqrt(moments["var"] + norm.epsilon)
    r = jax.lax.stop_gradient(jnp.clip(std / running_std, 1.0 / norm.r_max, norm.r_max))
    d = jax.lax.stop_gradient(jnp.clip((mean - moments["mean"]) / running_std, -norm.d_max, norm.d_max))
    warm = (count >= norm.warmup).astype(x.dtype)
    r, d = warm * r + (1.0 - warm), warm * d
    y = (x - mean) / std * r + d
    m = norm.momentum
    new = {"mean": m * moments["mean"] + (1 - m) * jax.lax.stop_gradient(mean),
           "var": m * moments["var"] + (1 - m) * jax.lax.stop_gradient(var)}
    return y * scale + bias, new


def mlp(params: dict, stats: dict, x: jax.Array, norm: Norm, train: bool) -> tuple[jax.Array, dict]:
    """(output, new stats): the forward pass; in training the running moments move and the count grows."""
    layers, norms, moved = params["layers"], params["norms"], {}
    for i in range(len(layers)):
        if i in norms:
            x, moved[i] = _renorm(x, norms[i]["scale"], norms[i]["bias"], stats["norms"][i], stats["count"],
                                  norm, train)
        x = x @ layers[i]["kernel"] + layers[i]["bias"]
        if i < len(layers) - 1:
            x = jax.nn.relu(x)
    return x, {"norms": moved, "count": stats["count"] + int(train)}


def acting(params: dict, stats: dict) -> dict:
    """The actor as it acts and is published: its layers, and each norm's scale, bias and running moments."""
    return {"layers": params["layers"],
            "norms": {i: {**norm, **stats["norms"][i]} for i, norm in params["norms"].items()}}


def trainable(actor: dict) -> dict:
    """The trainable half of an :func:`acting` actor."""
    return {"layers": actor["layers"],
            "norms": {i: {"scale": n["scale"], "bias": n["bias"]} for i, n in actor["norms"].items()}}


@dataclass(frozen=True, eq=False)
class CrossQNetworks:
    observation_spec: DictSpec
    action_spec: ArraySpec
    scale: ActionScale
    norm: Norm
    log_std_min: float
    log_std_max: float
    inputs: DictSpec
    """The fields the networks read: all but ``crossq.encoder.ignore_fields`` (export reads this)."""

    def distribution(self, actor_params, actor_stats, observation, train: bool = False):
        """((mean, log_std) of the pre-tanh Gaussian, the actor's new stats)."""
        out, stats = mlp(actor_params, actor_stats, flatten_observation(observation, self.inputs),
                         self.norm, train)
        mean, raw = jnp.split(out, 2, axis=-1)
        return (mean, bounded_log_std(raw, self.log_std_min, self.log_std_max, "clip", jnp)), stats

    def sample_from(self, mean, log_std, key) -> tuple[jax.Array, jax.Array]:
        """(action in bounds, log-probability of the unit-range action), reparameterised."""
        unit, logp = squashed_gaussian(mean, log_std, key)
        return self.scale.to_env(unit), jnp.sum(logp, axis=-1)

    def mean_action(self, actor, observation) -> jax.Array:
        """tanh(mean) in the action bounds, from an :func:`acting` actor (evaluation, export parity)."""
        (mean, _), _ = self.distribution(trainable(actor), _stats(actor), observation)
        return self.scale.to_env(jnp.tanh(mean))

    def sample(self, actor, observation, key) -> tuple[jax.Array, jax.Array]:
        """A sample of an :func:`acting` actor's policy and its log-probability."""
        (mean, log_std), _ = self.distribution(trainable(actor), _stats(actor), observation)
        return self.sample_from(mean, log_std, key)

    def q_values(self, critic_params, critic_stats, observation, action, train: bool = False):
        """(every critic's Q(o, a) [critics, batch...], the critics' new stats)."""
        xa = jnp.concatenate([flatten_observation(observation, self.inputs),
                              self.scale.to_unit(action)], axis=-1)
        out, stats = jax.vmap(lambda p, s: mlp(p, s, xa, self.norm, train))(critic_params, critic_stats)
        return out[..., 0], stats


def _stats(actor: dict) -> dict:
    return {"norms": {i: {"mean": n["mean"], "var": n["var"]} for i, n in actor["norms"].items()},
            "count": jnp.zeros((), jnp.int32)}


def make_networks(observation_spec: DictSpec, action_spec: ArraySpec, config: CrossQConfig, key: jax.Array):
    """(networks, actor params, actor stats, critic params, critic stats); the critics' are stacked
    on a leading axis. They read every field but ``config.encoder.ignore_fields`` (a robot file's
    reward-only cameras); camera images read are refused: CrossQ here has no image encoder."""
    inputs = network_inputs(observation_spec, config.encoder, "crossq.encoder")
    images = image_fields(inputs, EncoderConfig(image_fields=("auto",)), "crossq")
    if images or config.encoder.image_fields:
        raise ValueError(f"crossq reads state observations; {list(images or config.encoder.image_fields)} are "
                         "camera images (sac and ddpg train through the image encoder; list a camera in "
                         "crossq.encoder.ignore_fields, or reward_only in a robot file, if no network reads it)")
    obs_size, act_size = observation_size(inputs), action_spec.size
    actor_key, *critic_keys = jax.random.split(key, 1 + config.num_critics)
    actor_params, actor_stats = init_mlp(actor_key, [obs_size, *config.hidden_sizes, 2 * act_size],
                                         config.actor_batch_norm)
    critics = [init_mlp(k, [obs_size + act_size, *config.critic_hidden_sizes, 1], True) for k in critic_keys]
    critic_params, critic_stats = (jax.tree.map(lambda *xs: jnp.stack(xs), *[c[i] for c in critics]) for i in (0, 1))
    networks = CrossQNetworks(observation_spec, action_spec, ActionScale(action_spec), Norm.of(config),
                              config.log_std_min, config.log_std_max, inputs)
    return networks, actor_params, actor_stats, critic_params, critic_stats
