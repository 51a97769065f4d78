"""``embodyrl bench pixels``: pixel SAC's costs, learner and actor side.

Learner: one jitted ``update_many`` (K SAC+DrQ updates in a ``lax.scan``) on
stacked 84x84x9 uint8 frames, resident on the device, with the encoder's
matrix-product convolution gradient (:mod:`embodyrl.algos.conv`) against
the same update with the plain ``lax.conv`` gradient (the encoder as it was,
the baseline), alternating blocks in the same run. Medians per update.

Actor: one step of ``pendulum_pixels_stacked`` (physics + offscreen render +
frame stack) against one step of the state pendulum; the policy's action
for one stacked observation, jitted JAX (what ``embodyrl train``'s actors
run) and the numpy runtime's export of the same actor, whose per-tap
convolution is timed against the einsum over sliding windows it replaced.
"""

from __future__ import annotations

import statistics
from unittest import mock

import jax
import numpy as np

from ..algos import conv, encoders, sac
from ..algos.encoders import EncoderConfig
from ..hal.specs import ArraySpec, DictSpec
from . import median_seconds

IMAGE = "camera/front"


def _setup(quick: bool):
    side, frames, channels = (32, 3, (4, 4)) if quick else (84, 9, (16, 16, 16))
    obs_spec = DictSpec.of(ArraySpec(IMAGE, (side, side, frames), np.uint8, 0, 255))
    act_spec = ArraySpec("action", (1,), np.float32, -2.0, 2.0)
    encoder = EncoderConfig(image_fields=(IMAGE,), pixels_only=True, channels=channels,
                            strides=(2,) * len(channels))
    config = sac.SACConfig(discount=0.98, batch_size=8 if quick else 64, encoder=encoder)
    return obs_spec, act_spec, config


def _batches(obs_spec, config, k: int) -> dict:
    rng = np.random.default_rng(0)
    n, shape = config.batch_size, obs_spec[IMAGE].shape

    def images():
        return {IMAGE: rng.integers(0, 256, (k, n, *shape), dtype=np.uint8)}

    return jax.device_put({"observation": images(), "next_observation": images(),
                           "action": rng.uniform(-2, 2, (k, n, 1)).astype(np.float32),
                           "reward": rng.normal(size=(k, n)).astype(np.float32),
                           "discount": np.full((k, n), config.discount, np.float32)})


def learner_side(quick: bool) -> dict:
    k, blocks = (2, 2) if quick else (4, 3)
    obs_spec, act_spec, config = _setup(quick)
    networks, state = sac.init(jax.random.key(0), obs_spec, act_spec, config)
    batches = _batches(obs_spec, config, k)
    calls = {}
    for name, fn in (("plain", conv.plain_conv), ("matmul", conv.conv)):
        with mock.patch.object(encoders, "conv2d", fn):  # traced (compiled) inside the patch
            update_many = jax.jit(sac.make_update_many(networks, config))
            jax.block_until_ready(update_many(state, batches))
        calls[name] = update_many
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(blocks):
        for name, update_many in calls.items():
            times[name].append(median_seconds(lambda f=update_many: jax.block_until_ready(f(state, batches)), 1) / k)
    plain, matmul = statistics.median(times["plain"]), statistics.median(times["matmul"])
    return {"pixel_update_ms": round(1e3 * matmul, 2), "pixel_update_plain_conv_grad_ms": round(1e3 * plain, 2),
            "pixel_update_speedup": round(plain / matmul, 2), "pixel_image_shape": list(obs_spec[IMAGE].shape),
            "pixel_batch_size": config.batch_size, "pixel_updates_per_call": k,
            "pixel_encoder_channels": list(config.encoder.channels)}


def _env_step_ms(task: str, steps: int) -> tuple[float, object, dict]:
    """(median ms per step with uniform random actions, the device, its first observation)."""
    from .. import envs

    rng = np.random.default_rng(0)
    device, _ = envs.make(task)
    with device:
        observation = device.reset(0)
        spec = device.action_spec

        def step():
            device.step(rng.uniform(spec.minimum, spec.maximum).astype(spec.dtype))

        step()
        return 1e3 * median_seconds(step, steps), device, observation


def einsum_conv2d(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """The numpy runtime's convolution before the per-tap sum (the baseline): an einsum over sliding windows."""
    lead, (height, width, channels) = x.shape[:-3], x.shape[-3:]
    kh, kw = kernel.shape[:2]
    windows = np.lib.stride_tricks.sliding_window_view(x.reshape(-1, height, width, channels), (kh, kw), axis=(1, 2))
    windows = windows[:, ::stride, ::stride]  # [N, H', W', C, kh, kw]
    out = np.einsum("nhwcij,ijco->nhwo", windows, kernel, optimize=True) + bias
    return out.reshape(*lead, *out.shape[1:])


def _act_ms(device, observation, steps: int) -> tuple[float, float, float]:
    """(jitted JAX act, numpy runtime act, numpy act with the einsum convolution), median ms per action."""
    from ..cli.export import export_sac
    from ..hal import runtime
    from ..hal.runtime import NumpyPolicy
    from ..policy import JaxPolicy

    config = sac.SACConfig(encoder=EncoderConfig(image_fields=(IMAGE,), pixels_only=True,
                                                 channels=(16, 16, 16), strides=(2, 2, 2)))
    policy = JaxPolicy.for_specs(device.observation_spec, device.action_spec, config)
    policy.act(observation)
    jax_ms = 1e3 * median_seconds(lambda: policy.act(observation), steps)
    networks, _ = sac.init(jax.random.key(0), device.observation_spec, device.action_spec, config)
    numpy_policy = NumpyPolicy(*export_sac(networks, policy.params, config), seed=0)
    times: dict[str, list[float]] = {"taps": [], "einsum": []}
    for _ in range(3):  # alternate, so both see the same machine
        times["taps"].append(median_seconds(lambda: numpy_policy.act(observation), steps // 3))
        with mock.patch.object(runtime, "_conv2d", einsum_conv2d):
            times["einsum"].append(median_seconds(lambda: numpy_policy.act(observation), steps // 3))
    return jax_ms, 1e3 * statistics.median(times["taps"]), 1e3 * statistics.median(times["einsum"])


def actor_side(quick: bool) -> dict:
    steps = 20 if quick else 200
    pixel_ms, device, observation = _env_step_ms("pendulum_pixels_stacked", steps)
    state_ms, _, _ = _env_step_ms("pendulum", steps)
    jax_ms, numpy_ms, einsum_ms = _act_ms(device, observation, steps)
    return {"pixel_env_step_ms": round(pixel_ms, 3), "state_env_step_ms": round(state_ms, 3),
            "pixel_env_step_over_state": round(pixel_ms / state_ms, 1),
            "pixel_jax_act_ms": round(jax_ms, 3), "pixel_numpy_act_ms": round(numpy_ms, 3),
            "pixel_numpy_act_einsum_conv_ms": round(einsum_ms, 3),
            "pixel_numpy_act_speedup": round(einsum_ms / numpy_ms, 2)}


def run(quick: bool = False) -> dict:
    return {**learner_side(quick), **actor_side(quick)}
