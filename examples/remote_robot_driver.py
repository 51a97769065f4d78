"""Template: put a real arm behind embodyrl's robot server.

Copy this file to the robot's controller box, replace ``VendorArm`` (a
stand-in so the file runs as it is) with your vendor's SDK, and run it. On
one machine (loopback) it needs nothing more::

    python remote_robot_driver.py

Across a network the link takes CurveZMQ keys (plain TCP off loopback is
refused). One pair for the robot, one per actor (and per admin); each side
gets the other's public ``NAME.key``, never a ``NAME.key_secret``::

    embodyrl keys keys/robot robot          # on the robot box
    embodyrl keys keys/actor actor          # on the actor's machine; copy actor.key to the robot box
    mkdir -p keys/authorized && cp actor.key keys/authorized/
    python remote_robot_driver.py --bind tcp://0.0.0.0:5556 \
        --secret-key keys/robot/robot.key_secret --authorized-keys keys/authorized

(``--admin-keys DIR``: keys whose CLEAR releases the session of an actor
that holds the robot and is gone.) The actor then drives the arm as an
ordinary device, with its secret key and the robot's public key::

    from embodyrl.hal.drivers.remote import RemoteDevice
    from embodyrl.hal.wire.security import ClientKeys
    keys = ClientKeys("keys/actor/actor.key_secret", "keys/robot/robot.key")
    with RemoteDevice("tcp://robot-box:5556", keys=keys) as arm:
        obs = arm.reset(seed=0)
        obs = arm.step(action)

What you write is one class with five methods (``RobotDriver``): the specs,
``reset``, ``command``, ``read_observation`` and ``safe_action``. The server
does the rest: the protocol, retries, the action bounds, a deadline on every
driver call, and the watchdog that commands ``safe_action()`` when no fresh
command arrives within ``--watchdog-s`` (a dead actor or a dead link stops
the arm). A driver call that hangs latches an e-stop only a restart clears:
software cannot move the arm through a hung SDK, so keep the arm's hardware
e-stop within reach.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from embodyrl.hal.robot_server import RobotDriver, RobotServer
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.wire.security import ServerKeys


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="tcp://127.0.0.1:5556")
    parser.add_argument("--watchdog-s", type=float, default=0.2)
    parser.add_argument("--secret-key", help="the robot's NAME.key_secret")
    parser.add_argument("--authorized-keys", help="directory of the actors' public .key files")
    parser.add_argument("--admin-keys", help="directory of the admins' public .key files")
    parser.add_argument("--insecure", action="store_true", help="allow plain TCP off loopback (anyone can drive)")
    return parser.parse_args(argv)


def make_server(args: argparse.Namespace) -> RobotServer:
    keys = None
    if args.secret_key or args.authorized_keys:
        if not (args.secret_key and args.authorized_keys):
            raise SystemExit("--secret-key and --authorized-keys go together")
        keys = ServerKeys(Path(args.secret_key), Path(args.authorized_keys))
    return RobotServer(MyArmDriver(VendorArm()), args.bind, watchdog_s=args.watchdog_s, keys=keys,
                       admin_keys=args.admin_keys, allow_insecure=args.insecure)


def main() -> None:
    server = make_server(parse_args())
    print(f"serving on {server.endpoint}; Ctrl-C stops the arm and exits", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()  # commands the safe action first


if __name__ == "__main__":
    main()
