"""Template: put a real arm behind embodyrl's robot server.

Copy this file to the robot's controller box, replace ``VendorArm`` (a
stand-in so the file runs as it is) with your vendor's SDK, and run::

    python remote_robot_driver.py --bind tcp://0.0.0.0:5556

The learner side then drives the arm as an ordinary device::

    from embodyrl.hal.drivers.remote import RemoteDevice
    with RemoteDevice("tcp://robot-box:5556") as arm:
        obs = arm.reset(seed=0)
        obs = arm.step(action)

What you write is one class with five methods (``RobotDriver``): the specs,
``reset``, ``command``, ``read_observation`` and ``safe_action``. The server
does the rest: the protocol, retries, and the watchdog that commands
``safe_action()`` when no fresh command arrives within ``--watchdog-s``
(a dead actor or a dead link stops the arm).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from embodyrl.hal.robot_server import RobotDriver, RobotServer
from embodyrl.hal.specs import ArraySpec, DictSpec


class VendorArm:
    """Stand-in for a vendor SDK: a 6-joint arm that follows velocity commands."""

    def __init__(self, joints: int = 6):
        self.q = np.zeros(joints)
        self.qd = np.zeros(joints)
        self._last = time.monotonic()

    def _advance(self) -> None:
        now = time.monotonic()
        self.q += self.qd * min(now - self._last, 0.1)
        self._last = now

    def move_home(self, joint_offsets: np.ndarray) -> None:  # blocking in a real SDK
        self.q, self.qd = joint_offsets.copy(), np.zeros_like(self.qd)
        self._last = time.monotonic()

    def set_joint_velocities(self, qd: np.ndarray) -> None:
        self._advance()
        self.qd = qd.copy()

    def joint_state(self) -> tuple[np.ndarray, np.ndarray]:
        self._advance()
        return self.q.copy(), self.qd.copy()


class MyArmDriver(RobotDriver):
    """The one class a user writes: maps the SDK onto specs and four calls."""

    MAX_JOINT_SPEED = 0.5  # rad/s, the arm's own limit

    def __init__(self, sdk: VendorArm, control_period_s: float = 0.02):
        self.sdk = sdk
        n = len(sdk.q)
        self.control_period_s = control_period_s  # the server paces steps to this
        self.action_spec = ArraySpec("action", (n,), np.float32, -self.MAX_JOINT_SPEED, self.MAX_JOINT_SPEED)
        self.observation_spec = DictSpec.of(ArraySpec("qpos", (n,), np.float32),
                                            ArraySpec("qvel", (n,), np.float32))
        self._rng = np.random.default_rng()

    def reset(self, seed):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.sdk.move_home(self._rng.uniform(-0.1, 0.1, len(self.sdk.q)))
        return self.read_observation()

    def command(self, action):
        self.sdk.set_joint_velocities(np.asarray(action, np.float64))

    def read_observation(self):
        q, qd = self.sdk.joint_state()
        return {"qpos": q.astype(np.float32), "qvel": qd.astype(np.float32)}

    def safe_action(self):
        return np.zeros(self.action_spec.shape, np.float32)  # stop every joint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="tcp://127.0.0.1:5556")
    parser.add_argument("--watchdog-s", type=float, default=0.2)
    args = parser.parse_args()
    server = RobotServer(MyArmDriver(VendorArm()), args.bind, watchdog_s=args.watchdog_s)
    print(f"serving on {server.endpoint}; Ctrl-C stops the arm and exits", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()  # commands the safe action first


if __name__ == "__main__":
    main()
