"""Driver costs, each beside its baseline: cameras, the remote link, the numpy runtime.

* ``render``: pendulum control steps per second with one 84x84 camera
  rendered offscreen (default: no shadows, reflections or skybox; and with
  them), against the same steps without a camera.
* ``remote``: the simulated arm stepped through RemoteDevice and a RobotServer
  over loopback TCP (server on a thread of this process), against stepping
  the same MuJoCo arm directly.
* ``runtime``: one action from the exported policy in numpy against the
  jitted JAX policy (256x256 MLP, pendulum specs, no exploration).
* ``end_effector``: the 7-joint arm's control steps per second moved by its hand
  (``arm_reach_ee``: IK and five PD steps per 20 ms period) against joint torques
  (``arm_reach``, the same period); and IK on the arm's model: how often it converges
  (to 0.1 mm) for a 2 cm move from a reachable pose, for a far point from the rest posture
  and for a full pose, its errors, and the time of one solve.

Figures are medians over repeats; ratios are real / baseline.
"""

from __future__ import annotations

import itertools
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


def _end_effector(quick: bool) -> dict:
    from .. import envs
    from ..envs.arm import arm_model

    n, repeats, poses = (20, 2, 20) if quick else (500, 5, 500)
    out = {}
    for key, name in (("ee_steps_per_s", "arm_reach_ee"), ("joint_steps_per_s", "arm_reach")):
        device, _ = envs.make(name)
        rng = np.random.default_rng(0)
        with device:
            device.reset(seed=0)
            spec = device.action_spec
            actions = rng.uniform(spec.minimum, spec.maximum, (n, *spec.shape)).astype(spec.dtype) * 0.3
            cycle = itertools.cycle(actions)
            out[key] = _median_rate(lambda d=device, a=cycle: d.step(next(a)), n, repeats)
    out["ee_step_ratio"] = out["ee_steps_per_s"] / out["joint_steps_per_s"]
    arm = arm_model()
    rng = np.random.default_rng(0)
    span = arm.upper - arm.lower
    qs = rng.uniform(arm.lower + 0.1 * span, arm.upper - 0.1 * span, (poses, arm.dof))
    targets = [arm.forward(q) for q in qs]
    moves = rng.normal(size=(poses, 3))
    moves *= 0.02 / np.linalg.norm(moves, axis=1, keepdims=True)
    start = time.perf_counter()
    near = [arm.solve(q, position + move) for q, (position, _), move in zip(qs, targets, moves, strict=True)]
    out["ik_near_solve_ms"] = (time.perf_counter() - start) / poses * 1e3
    far = [arm.solve(arm.rest, position, iterations=100) for position, _ in targets]
    pose = [arm.solve(arm.rest, position, rotation, iterations=200) for position, rotation in targets[:poses // 5]]
    for key, results in (("ik_near", near), ("ik_far", far), ("ik_pose", pose)):
        errors = np.array([r.position_error_m for r in results])
        out[f"{key}_converged"] = float(np.mean([r.converged for r in results]))
        out[f"{key}_error_m_p50"], out[f"{key}_error_m_p95"] = (float(v) for v in np.percentile(errors, [50, 95]))
    out["ik_pose_orientation_error_rad_p95"] = float(np.percentile([r.orientation_error_rad for r in pose], 95))
    out["ik_within_limits"] = all(((r.q >= arm.lower) & (r.q <= arm.upper)).all() for r in (*near, *far, *pose))
    return out


def run(quick: bool = False) -> dict:
    return {**_render(quick), **_remote(quick), **_runtime(quick), **_end_effector(quick)}
