"""Driver costs, each beside its baseline: cameras, the remote link, the numpy runtime.

* ``render``: pendulum control steps per second with one 84x84 camera
  rendered offscreen (default: no shadows, reflections or skybox; and with
  them), against the same steps without a camera.
* ``remote``: the simulated arm stepped through RemoteDevice and a RobotServer
  over loopback TCP (server on a thread of this process), against stepping
  the same MuJoCo arm directly.
* ``runtime``: one action from the exported policy in numpy against the
  jitted JAX policy (256x256 MLP, pendulum specs, no exploration).

Figures are medians over repeats; ratios are real / baseline.
"""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np


def _median_rate(fn, n: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def _render(quick: bool) -> dict:
    from ..envs import pendulum, pixels

    n, repeats = (20, 2) if quick else (300, 5)
    out = {}
    for key, device in (("render_steps_per_s", pixels.make_device()),
                        ("render_effects_steps_per_s", pixels.make_device(pixels.PixelsConfig(camera_effects=True))),
                        ("state_steps_per_s", pendulum.make_device())):
        with device:
            device.reset(seed=0)
            action = np.zeros(1, np.float32)
            device.step(action)
            out[key] = _median_rate(lambda d=device, a=action: d.step(a), n, repeats)
    out["render_ratio"] = out["render_steps_per_s"] / out["state_steps_per_s"]
    return out


def _remote(quick: bool) -> dict:
    from ..envs import arm
    from ..hal.drivers.remote import RemoteDevice
    from ..hal.robot_server import DeviceDriver, RobotServer

    n, repeats = (20, 2) if quick else (500, 5)
    server = RobotServer(DeviceDriver(arm.make_device()), watchdog_s=2.0)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    action = np.zeros(7, np.float32)
    try:
        with RemoteDevice(server.endpoint, timeout_s=2.0) as remote, arm.make_device() as local:
            remote.reset(seed=0)
            local.reset(seed=0)
            remote_rate = _median_rate(lambda: remote.step(action), n, repeats)
            local_rate = _median_rate(lambda: local.step(action), n, repeats)
    finally:
        stop.set()
        thread.join(5)
        server.close()
    return {"remote_steps_per_s": remote_rate, "local_steps_per_s": local_rate,
            "remote_ratio": remote_rate / local_rate}


def _runtime(quick: bool) -> dict:
    import jax

    from ..algos import ddpg
    from ..cli.export import export_ddpg
    from ..envs import pendulum
    from ..hal.runtime import NumpyPolicy
    from ..hal.steps import PolicyVersion
    from ..policy import JaxPolicy

    n, repeats = (20, 2) if quick else (2000, 5)
    config = ddpg.DDPGConfig()
    action_spec = pendulum.make_device().action_spec
    jax_policy = JaxPolicy.for_specs(pendulum.OBSERVATION_SPEC, action_spec, config, seed=0)
    networks, _, _ = ddpg.make_networks(pendulum.OBSERVATION_SPEC, action_spec, config.hidden_sizes,
                                        jax.random.key(0))
    numpy_policy = NumpyPolicy(*export_ddpg(networks, jax_policy.params, config, PolicyVersion(1, 1)))
    obs = {"orientation": np.array([1.0, 0.0], np.float32), "angular_velocity": np.zeros(1, np.float32)}
    jax_policy.act(obs, explore=False)  # compile
    numpy_rate = _median_rate(lambda: numpy_policy.act(obs, explore=False), n, repeats)
    jax_rate = _median_rate(lambda: jax_policy.act(obs, explore=False), n, repeats)
    return {"numpy_actions_per_s": numpy_rate, "jax_actions_per_s": jax_rate,
            "runtime_ratio": numpy_rate / jax_rate}


def run(quick: bool = False) -> dict:
    return {**_render(quick), **_remote(quick), **_runtime(quick)}
