"""The remote robot: RemoteDevice against the simulated arm server over real sockets.

Servers run in spawned processes (the MuJoCo arm behind a RobotServer) with
injected latency and dropped replies; one test kills a real client process
and checks that the server's watchdog stopped the arm.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest
import zmq

from embodyrl.envs import arm, pendulum
from embodyrl.hal.drivers.remote import RemoteDevice, RemoteError, RemoteTimeout
from embodyrl.hal.robot_server import DeviceDriver, Faults, RobotServer, serve_process
from embodyrl.hal.testing import DeviceConformance
from embodyrl.hal.wire.codec import decode, encode

ARM = "embodyrl.envs.arm:make_device"


def _start_server(watchdog_s: float, faults: Faults):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=serve_process, args=(ARM, "tcp://127.0.0.1:*", queue, watchdog_s, faults),
                          daemon=True)
    process.start()
    return process, queue.get(timeout=60)


def _stop(process) -> None:
    if process.is_alive():
        process.terminate()
        process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)


@pytest.fixture(scope="module")
def lossy_server():
    """The simulated arm, 2 ms reply latency, 20% of replies dropped."""
    process, endpoint = _start_server(3.0, Faults(latency_s=0.002, drop_probability=0.2, seed=1))
    yield endpoint
    _stop(process)


@pytest.fixture
def server_factory():
    started = []

    def start(watchdog_s=1.0, faults=None):
        process, endpoint = _start_server(watchdog_s, faults or Faults())
        started.append(process)
        return endpoint

    yield start
    for process in started:
        _stop(process)


class TestRemoteArmConformance(DeviceConformance):
    @pytest.fixture
    def device(self, lossy_server):
        with RemoteDevice(lossy_server, timeout_s=0.05, retries=40, backoff=1.0) as d:
            yield d


def _trajectory(device, seed: int, actions) -> list[dict]:
    observations = [device.reset(seed=seed)]
    observations += [device.step(a) for a in actions]
    return observations


def _actions(n: int):
    rng = np.random.default_rng(0)
    spec = arm.make_device().action_spec
    return [spec.sample_uniform(rng) for _ in range(n)]


def _assert_same(local, remote):
    for a, b in zip(local, remote, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_lost_replies_are_retried_without_stepping_twice(lossy_server):
    actions = _actions(40)
    with arm.make_device() as local:
        expected = _trajectory(local, 5, actions)
    with RemoteDevice(lossy_server, timeout_s=0.05, retries=40, backoff=1.0) as remote:
        before = remote.server_status()
        got = _trajectory(remote, 5, actions)
        after = remote.server_status()
        retried = remote.attempts_retried
    _assert_same(expected, got)  # one physics step per action: no replayed request stepped again
    assert after["steps"] - before["steps"] == 40
    assert after["dropped_replies"] > before["dropped_replies"] and after["replays"] > before["replays"]
    assert retried >= after["dropped_replies"] - before["dropped_replies"] - 1


def test_replies_later_than_the_deadline_are_retried_and_stale_ones_discarded(server_factory):
    endpoint = server_factory(faults=Faults(latency_s=0.04))
    actions = _actions(8)
    with arm.make_device() as local:
        expected = _trajectory(local, 2, actions)
    with RemoteDevice(endpoint, timeout_s=0.025, retries=10) as remote:
        got = _trajectory(remote, 2, actions)
        status = remote.server_status()
        assert remote.attempts_retried >= 9 and remote.stale_replies > 0  # each request: one retry at least
    _assert_same(expected, got)
    assert status["steps"] == 8


def _drive_forever(endpoint: str, queue) -> None:
    """Child process: take control and step with full torque until killed."""
    device = RemoteDevice(endpoint, timeout_s=1.0, retries=3)
    with device:
        device.reset(seed=0)
        full = device.action_spec.maximum.astype(np.float32)
        for i in range(1_000_000):
            device.step(full)
            if i == 5:
                queue.put("stepping")


def test_watchdog_stops_the_arm_when_the_actor_dies(server_factory):
    endpoint = server_factory(watchdog_s=1.0)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_drive_forever, args=(endpoint, queue), daemon=True)
    child.start()
    try:
        assert queue.get(timeout=60) == "stepping"
        with RemoteDevice(endpoint, timeout_s=1.0, retries=1) as probe:
            pytest.fail("a second actor took control of a robot in use")
    except RemoteError as err:
        assert err.reason == "refused"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    status = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.4)  # past the watchdog period: the dead actor's session expires
        try:
            with RemoteDevice(endpoint, timeout_s=1.0, retries=1) as probe:
                status = probe.server_status()
                break
        except RemoteError:
            continue
    assert status is not None, "the dead actor's session never expired"
    assert status["watchdog_trips"] == 1
    assert status["steps"] >= 6
    assert status["last_action"] == [0.0] * 7  # the safe action, not the dead actor's full torque


@pytest.fixture
def serve_pendulum(served):
    """Start RobotServers on threads in this process (fast): the pendulum by default."""

    def start(watchdog_s: float = 2.0, driver=None) -> RobotServer:
        server = RobotServer(driver or DeviceDriver(pendulum.make_device()), watchdog_s=watchdog_s)
        return served(server, server.serve)

    return start


@pytest.fixture
def pendulum_server(serve_pendulum):
    return serve_pendulum(2.0)


def test_watchdog_refuses_steps_after_a_stall_until_reset(serve_pendulum):
    pendulum_server = serve_pendulum(0.2)
    with RemoteDevice(pendulum_server.endpoint, timeout_s=1.0, retries=1) as device:
        device.reset(seed=0)
        device.step(np.array([2.0], np.float32))
        time.sleep(0.5)  # the actor stalls past the watchdog
        with pytest.raises(RemoteError, match="watchdog") as err:
            device.step(np.array([2.0], np.float32))
        assert err.value.reason == "watchdog"
        assert pendulum_server.stats.watchdog_trips == 1
        np.testing.assert_array_equal(pendulum_server.last_action, [0.0])
        device.reset(seed=0)
        device.step(np.array([2.0], np.float32))


def test_estop_latches_on_the_server(pendulum_server):
    with RemoteDevice(pendulum_server.endpoint, timeout_s=1.0) as device:
        device.reset(seed=0)
        device.step(np.array([2.0], np.float32))
        device.estop("operator")
        assert pendulum_server.estop_reason == "operator"
        np.testing.assert_array_equal(pendulum_server.last_action, [0.0])
        device.clear_estop()
        assert pendulum_server.estop_reason is None
        device.step(np.array([1.0], np.float32))


def test_malformed_requests_get_a_named_error_and_the_server_keeps_serving(pendulum_server):
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.linger = 0
    raw.connect(pendulum_server.endpoint)
    try:
        for frames, reason in [([b"\xc1 not msgpack"], "header_malformed"),
                               (encode("STEP", {"seq": "one"}), "bad_seq"),
                               (encode("STEP", {"seq": 1}, {"action": np.zeros(1, np.float32)}), "no_session")]:
            raw.send_multipart(frames)
            assert raw.poll(2000)
            reply = decode(raw.recv_multipart())
            assert reply.kind == "ERROR" and reply.fields["reason"] == reason
        raw.send_multipart(encode("HELLO", {"seq": 1}))
        assert raw.poll(2000) and decode(raw.recv_multipart()).kind == "SPECS"
        raw.send_multipart(encode("STEP", {"seq": 2}, {"action": np.zeros(3, np.float32)}))
        assert raw.poll(2000)
        reply = decode(raw.recv_multipart())
        assert reply.fields["reason"] == "bad_action" and "shape" in reply.fields["detail"]
        raw.send_multipart(encode("BYE", {"seq": 3}))
        assert raw.poll(2000)
    finally:
        raw.close()
    with RemoteDevice(pendulum_server.endpoint, timeout_s=1.0) as device:
        device.reset(seed=0)
        device.step(np.zeros(1, np.float32))
    assert pendulum_server.stats.steps == 1


def test_an_unreachable_server_times_out_within_the_deadline():
    device = RemoteDevice("tcp://127.0.0.1:9", timeout_s=0.05, retries=2, backoff=1.0)
    start = time.monotonic()
    with pytest.raises(RemoteTimeout, match="3 attempts"):
        device.connect()
    assert time.monotonic() - start < 10.0  # bounded, not hung
    assert not device._connected


def _load_template():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "examples" / "remote_robot_driver.py"
    spec = importlib.util.spec_from_file_location("remote_robot_driver", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestTemplateDriverConformance(DeviceConformance):
    """The example a user copies: its driver behind a real server passes the suite."""

    @pytest.fixture(scope="class")
    def server(self):
        template = _load_template()
        server = RobotServer(template.MyArmDriver(template.VendorArm(), control_period_s=0.005), watchdog_s=2.0)
        stop = threading.Event()
        thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
        thread.start()
        yield server
        stop.set()
        thread.join(5)
        server.close()

    @pytest.fixture
    def device(self, server):
        with RemoteDevice(server.endpoint, timeout_s=1.0) as d:
            yield d

    def test_the_arm_moves_as_commanded(self, device):
        start = device.reset(seed=0)["qpos"]
        for _ in range(10):
            obs = device.step(np.full(6, 0.5, np.float32))
        assert (obs["qpos"] > start + 0.01).all() and np.allclose(obs["qvel"], 0.5)


def test_the_template_serves_with_keys_and_refuses_plain_tcp_off_loopback(tmp_path):
    from embodyrl.hal.wire.security import ClientKeys, SecurityError, generate_keys

    template = _load_template()
    with pytest.raises(SecurityError, match="plain TCP"):
        template.make_server(template.parse_args(["--bind", "tcp://0.0.0.0:*"]))
    _, robot_secret = generate_keys(tmp_path / "robot", "robot")
    actor_public, actor_secret = generate_keys(tmp_path / "actor", "actor")
    (tmp_path / "authorized").mkdir()
    actor_public.rename(tmp_path / "authorized" / actor_public.name)
    server = template.make_server(template.parse_args(
        ["--bind", "tcp://127.0.0.1:*", "--secret-key", str(robot_secret),
         "--authorized-keys", str(tmp_path / "authorized")]))
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        keys = ClientKeys(actor_secret, tmp_path / "robot" / "robot.key")
        with RemoteDevice(server.endpoint, keys=keys, timeout_s=2.0) as arm:
            arm.reset(seed=0)
            arm.step(np.full(6, 0.5, np.float32))
            assert arm.server_status()["secured"] is True
    finally:
        stop.set()
        thread.join(5)
        server.close()


class _FlakySDKDriver(DeviceDriver):
    """The pendulum, but the 'SDK' raises on the third command."""

    def __init__(self):
        super().__init__(pendulum.make_device())
        self.calls = 0

    def command(self, action):
        self.calls += 1
        if self.calls == 3:
            raise OSError("vendor SDK: connection to the arm lost")
        super().command(action)


def test_a_driver_exception_stops_the_arm_and_is_reported(serve_pendulum):
    server = serve_pendulum(driver=_FlakySDKDriver())
    with RemoteDevice(server.endpoint, timeout_s=1.0) as device:
        device.reset(seed=0)
        device.step(np.array([1.0], np.float32))
        device.step(np.array([1.0], np.float32))
        with pytest.raises(RemoteError, match="connection to the arm lost") as err:
            device.step(np.array([1.0], np.float32))
        assert err.value.reason == "driver_fault"
        np.testing.assert_array_equal(server.last_action, [0.0])  # the safe action went out after
        device.step(np.array([1.0], np.float32))  # the server kept serving


def test_images_cross_the_link_as_uint8(serve_pendulum):
    from embodyrl.envs import pixels

    server = serve_pendulum(driver=DeviceDriver(pixels.make_device()))
    with pixels.make_device() as local, RemoteDevice(server.endpoint, timeout_s=2.0) as remote:
        assert remote.observation_spec["camera/front"].shape == (84, 84, 3)
        a, b = local.reset(seed=1), remote.reset(seed=1)
        assert b["camera/front"].dtype == np.uint8
        np.testing.assert_array_equal(a["camera/front"], b["camera/front"])


def test_the_remote_path_imports_without_mujoco_or_jax():
    import subprocess
    import sys

    code = ("import sys; sys.modules['mujoco'] = None; sys.modules['jax'] = None;"
            "import embodyrl.hal.robot_server, embodyrl.hal.drivers.remote, embodyrl.hal.runtime; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def _numpy_actor_on_remote_robot(learner: str, robot: str, export: str, results) -> None:
    """Child process: the edge as shipped: RemoteDevice + NumpyPolicy + ActorLoop + LearnerLink."""
    import sys

    from embodyrl.envs import pendulum as pendulum_task
    from embodyrl.hal import runtime
    from embodyrl.hal.actor import ActorConfig, ActorLoop
    from embodyrl.hal.wire.client import LearnerLink
    from embodyrl.hal.wire.protocol import DeviceInfo

    device = RemoteDevice(robot, timeout_s=0.05, retries=40, backoff=1.0)
    policy = runtime.load(export, seed=0)
    with device:
        info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
        link = LearnerLink(learner, actor_name="remote", actor_id=1, devices=[info],
                           handshake_timeout_s=30, peer_timeout_s=30)
        with link:
            loop = ActorLoop(device, pendulum_task.SwingUp(), policy, link,
                             ActorConfig(actor_id=1, send_every=32, random_steps=0, seed=1))
            stats = loop.run()  # until the learner says goodbye
        results.put({"env_steps": stats.env_steps, "weight_updates": stats.weight_updates,
                     "version": list(policy.version), "retried": device.attempts_retried,
                     "bye": link.bye_reason, "jax": "jax" in sys.modules})


def test_whole_edge_path_numpy_actor_drives_the_remote_robot_for_the_learner(tmp_path):
    """The edge as shipped (a numpy actor process on a lossy remote robot) against the real learner
    service: it follows the published weights, its rows reach the replay, no retried request steps
    the robot twice, and the learner's goodbye ends it."""
    import queue

    import jax

    from embodyrl import envs
    from embodyrl.algos import ddpg
    from embodyrl.cli.export import export_ddpg
    from embodyrl.hal import params as flat_params
    from embodyrl.hal import runtime
    from embodyrl.learner.testing import ServedLearner

    obs_spec, act_spec = pendulum.OBSERVATION_SPEC, pendulum.make_device().action_spec
    config = ddpg.DDPGConfig(hidden_sizes=(16,))
    networks, actor, _ = ddpg.make_networks(obs_spec, act_spec, config.hidden_sizes, jax.random.key(0))
    runtime.save(tmp_path / "policy", *export_ddpg(networks, actor, config))
    _, newer, _ = ddpg.make_networks(obs_spec, act_spec, config.hidden_sizes, jax.random.key(1))

    ctx = mp.get_context("spawn")
    robot_queue = ctx.Queue()
    robot = ctx.Process(target=serve_process, daemon=True,
                        args=("embodyrl.envs.pendulum:make_device", "tcp://127.0.0.1:*", robot_queue, 3.0,
                              Faults(latency_s=0.001, drop_probability=0.1, seed=2)))
    robot.start()
    robot_endpoint = robot_queue.get(timeout=60)
    # the real service; it publishes the newer weights as version (77, 1)
    learner = ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="remote", incarnation=77,
                            peer_timeout_s=30, weights=flat_params.flatten({"actor": jax.device_get(newer)}))
    results = ctx.Queue()
    actor = ctx.Process(target=_numpy_actor_on_remote_robot, daemon=True,
                        args=(learner.endpoint, robot_endpoint, str(tmp_path / "policy"), results))
    actor.start()
    try:
        assert learner.wait(lambda service: service.counters.env_steps >= 300, timeout_s=90), \
            "the learner side timed out"
        learner.close()  # the service's own shutdown: final commit and ACKs, then its goodbye
        try:
            result = results.get(timeout=30)
        except queue.Empty:
            pytest.fail(f"the actor did not end on the learner's goodbye within 30 s (alive: {actor.is_alive()}, "
                        f"exit code {actor.exitcode})")
        with RemoteDevice(robot_endpoint, timeout_s=0.05, retries=40, backoff=1.0) as probe:
            status = probe.server_status()
    finally:
        learner.close()
        for process in (actor, robot):
            _stop(process)
    assert result["bye"] == "the test is over"  # the learner's goodbye ended it
    assert result["jax"] is False  # the actor acted with numpy alone
    assert result["version"] == [77, 1] and result["weight_updates"] >= 1  # it followed the learner
    assert 300 <= sum(t.steps.env_steps for t in learner.taken) <= result["env_steps"]
    counts = np.concatenate([t.steps.policy_count[~t.steps.final] for t in learner.taken])
    assert counts.max() == 1
    assert result["retried"] > 0 and status["dropped_replies"] > 0  # replies were lost on the way
    assert status["steps"] == result["env_steps"]  # and no retry stepped the robot twice
