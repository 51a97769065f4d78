"""Pushing a block to a target on a table with the 7-DoF arm (the shipped ``assets/arm7_push.xml``).

The sim stand-in for a HIL-SERL-style experiment on a real robot (demonstrations, RLPD,
a person who takes over when the policy goes astray, a success classifier on camera
frames): FetchPush's task on the arm of ``arm_reach``.

The arm: the seven joints of ``arm7.xml`` (links, joint damping; the elbow bends the
other way, so the arm can fold over the table), gravity-compensated, with no motors.
Its last link is welded to a mocap body, as Gymnasium-Robotics' Fetch tasks drive their
arm, so the joints follow an end-effector command: the pusher (a 1.5 cm-radius vertical
cylinder under the last link) slides 5 mm above the table, pointing down. Only the
pusher, the block and the table collide.

Action: ``(dx, dy)`` in ``[-1, 1]^2`` (float32): the pusher's planar displacement this
control step, times :attr:`ArmPushConfig.max_step_m` (2 cm) from where the pusher is,
clipped to the workspace (x 0.28..0.68 m, y -0.28..0.28 m, at most 0.70 m from the
base). Zero holds the pusher where it is. Control at 25 Hz (10 physics steps of 4 ms);
episodes are truncated after 50 steps (2 s).

Observation (float32, metres and m/s, world frame, the arm's base at the origin, the
table top at z = 0.2): ``ee_pos`` (the pusher's bottom centre), ``block_pos`` (the
block's centre), ``target_pos`` (the target at the block's centre height), ``ee_vel``
and ``block_vel`` (linear velocities), ``block_rel`` (block - pusher) and ``target_rel``
(target - block), 3 each. With ``ArmPushConfig.camera = (w, h)``
also ``camera/top``: uint8 h x w x 3 looking straight down at the table from 1 m above
it (blue-grey table, red block, the green target disc, the dark pusher; the 5 cm block
reaches the 3 cm disc about when its centre comes within the 5 cm of success). The arm's links are left out of the image (geom group 3, which offscreen
cameras do not draw, as a robot mask would), so they never hide the block. Rendered
without shadows or antialiasing (~0.6 ms a 48 x 48 frame in software GL).

Reset (seeded: ``device.reset(seed=...)`` is deterministic): the arm at its start pose
(the pusher at x 0.33, y 0, near the base), the block (a 5 cm, 0.2 kg box, axis-aligned)
uniform in x 0.42..0.55, y -0.1..0.1, the target uniform in x 0.35..0.65,
y -0.2..0.2 at 12 to 25 cm (xy) from the block.

Reward (:class:`Push`, sparse, as HIL-SERL's tasks): 1.0 on a step whose next
observation has the block within 5 cm (xy) of the target, else 0; that step ends the
episode (``terminated``). ``episode_metrics``: ``success`` (1.0 if the block reached the
target) and ``final_distance`` (block to target, xy, at the end); ``success_reward`` is
1.0 (the operator's success label pays it).

Scripted help: :func:`expert` (a pure function of the observation: around the block,
then push it along the block-target line) succeeds in every seeded episode we tried,
in 25 steps on average; as the teleop source ``script:embodyrl.envs.arm_push:expert``
it records demonstrations. :data:`person` (``script:embodyrl.envs.arm_push:person``) is a
scripted person who takes over with the expert's actions when the policy leaves a
corridor (see :class:`Person`).

Size next to HIL-SERL's real tasks: those run real 6/7-DoF arms with wrist and front
cameras at 10 Hz, ~100-step episodes and image policies (a pretrained ResNet encoder,
replay buffers of images in RAM), with 6-D end-effector deltas and a gripper. This is a
state-based planar push in simulation: a 2-D action, a 15-number observation, 50 steps
at 25 Hz, thousands of simulated steps per second on one core. It is sized for RLPD
with ~20 demonstrations to learn in 10-30k environment steps: a random policy never
succeeds (0 of 200 episodes), so the sparse reward is found through the
demonstrations and the person's corrections, as on the real tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..hal.drivers.mujoco import MujocoDevice, load_model
from ..hal.rewards import Success
from ..hal.specs import ArraySpec, DictSpec
from ..hal.task import Task

ASSET = Path(__file__).with_name("assets") / "arm7_push.xml"
CAMERA = "top"
CAMERA_FIELD = f"camera/{CAMERA}"
SUCCESS_DISTANCE_M = 0.05
REWARD_BOUND = 10.0
"""The largest |reward| a push step pays, with a margin: the sparse success (1.0), or a person's label."""
"""The block's centre within this (xy) of the target's: success."""
EE_HEIGHT_M = 0.205
"""The pusher's bottom: 5 mm above the table top (z 0.2)."""
HAND_OFFSET_M = 0.1
"""The welded link's origin above the pusher's bottom (where the mocap body goes)."""
WORKSPACE_LOW = np.array([0.28, -0.28])
WORKSPACE_HIGH = np.array([0.68, 0.28])
REACH_M = 0.70
"""The pusher's largest distance (xy) from the arm's base: the arm's reach, with a margin."""
BLOCK_HALF_M = 0.025
PUSHER_RADIUS_M = 0.015

SENSED = ("ee_pos", "block_pos", "target_pos", "ee_vel", "block_vel")
RELATIVE = {"block_rel": ("block_pos", "ee_pos"), "target_rel": ("target_pos", "block_pos")}
"""Differences of sensed positions (FetchPush's ``object_rel_pos``): what a policy needs, given."""
FIELDS = (*SENSED, *RELATIVE)
OBSERVATION_SPEC = DictSpec(tuple(ArraySpec(name, (3,), np.float32) for name in FIELDS))
ACTION_SPEC = ArraySpec("action", (2,), np.float32, -1.0, 1.0)


@dataclass(frozen=True)
class ArmPushConfig:
    control_substeps: int = 10
    """Physics steps (4 ms) per control step: 10 is 25 Hz."""
    max_episode_steps: int = 50
    max_step_m: float = 0.02
    """The commanded displacement per control step for an action element of 1 (the pusher
    covers ~90% of it within the step)."""
    block_low: tuple[float, float] = (0.42, -0.1)
    block_high: tuple[float, float] = (0.55, 0.1)
    """The block's start (xy) is uniform in this box."""
    target_low: tuple[float, float] = (0.35, -0.2)
    target_high: tuple[float, float] = (0.65, 0.2)
    """The target (xy) is uniform in this box, at a distance from the block within ``target_distance_m``."""
    target_distance_m: tuple[float, float] = (0.12, 0.25)
    camera: tuple[int, int] | None = None
    """``(width, height)`` of the ``camera/top`` image; None: no camera (fast)."""
    camera_effects: bool = False
    """Shadows, reflections, skybox: realism at many times the cost in software GL."""


def xy_distance(observation, field_a: str = "block_pos", field_b: str = "target_pos") -> float:
    """Distance between two observation fields in the table's plane."""
    return float(np.linalg.norm(np.asarray(observation[field_a][:2], np.float64)
                                - np.asarray(observation[field_b][:2], np.float64)))


def block_at_target(observation) -> bool:
    """The success condition: the block within :data:`SUCCESS_DISTANCE_M` (xy) of the target."""
    return xy_distance(observation) < SUCCESS_DISTANCE_M


class Push(Task):
    """Sparse reward 1.0 when the block reaches the target (terminal), else 0."""

    name = "arm_push"
    success_reward = 1.0

    def __init__(self, config: ArmPushConfig = ArmPushConfig()):
        self.max_episode_steps = config.max_episode_steps
        self.success = Success(block_at_target, value=self.success_reward)

    def reward(self, observation, action, next_observation) -> float:
        return self.success(observation, action, next_observation)

    def terminated(self, next_observation) -> bool:
        return block_at_target(next_observation)

    def episode_metrics(self, observations) -> dict[str, float]:
        return {"success": float(any(block_at_target(o) for o in observations)),
                "final_distance": xy_distance(observations[-1])}


def _clip_to_workspace(xy: np.ndarray) -> np.ndarray:
    xy = np.minimum(np.maximum(xy, WORKSPACE_LOW), WORKSPACE_HIGH)
    radius = float(np.hypot(xy[0], xy[1]))
    return xy * (REACH_M / radius) if radius > REACH_M else xy


class ArmPushDevice(MujocoDevice):
    """The push scene with a planar end-effector action (see the module docstring)."""

    def __init__(self, config: ArmPushConfig = ArmPushConfig()):
        import mujoco

        model = load_model(ASSET)
        name2id = mujoco.mj_name2id
        obj = mujoco.mjtObj
        self._sensors = {}
        for field in SENSED:
            i = name2id(model, obj.mjOBJ_SENSOR, field)
            start = int(model.sensor_adr[i])
            self._sensors[field] = slice(start, start + 3)
        self._ee = name2id(model, obj.mjOBJ_SITE, "ee")
        self._hand = int(model.body_mocapid[name2id(model, obj.mjOBJ_BODY, "hand")])
        self._target = int(model.body_mocapid[name2id(model, obj.mjOBJ_BODY, "target")])
        self._block_qpos = int(model.jnt_qposadr[name2id(model, obj.mjOBJ_JOINT, "block")])
        self.config = config
        super().__init__(model, control_substeps=config.control_substeps,
                         observation_fn=self._observe_state, observation_spec=OBSERVATION_SPEC,
                         reset_fn=self._place, cameras=None if config.camera is None else {CAMERA: config.camera},
                         camera_effects=config.camera_effects)
        self.action_spec = ACTION_SPEC
        self._low, self._high = ACTION_SPEC.minimum.astype(np.float64), ACTION_SPEC.maximum.astype(np.float64)

    def _observe_state(self, model, data) -> dict[str, np.ndarray]:
        observation = {field: data.sensordata[s].astype(np.float32) for field, s in self._sensors.items()}
        for field, (a, b) in RELATIVE.items():
            observation[field] = observation[a] - observation[b]
        return observation

    def _place(self, model, data, rng: np.random.Generator) -> None:
        c = self.config
        block = rng.uniform(c.block_low, c.block_high)
        low, high = c.target_distance_m
        for _ in range(1000):  # rejection sampling; the default ranges accept ~1 draw in 3
            target = rng.uniform(c.target_low, c.target_high)
            if low <= np.linalg.norm(target - block) <= high:
                break
        else:
            raise ValueError("ArmPushConfig: no target within target_distance_m of the block in 1000 draws")
        data.qpos[self._block_qpos:self._block_qpos + 2] = block
        data.mocap_pos[self._target, :2] = target

    def _step(self, action: np.ndarray) -> dict[str, np.ndarray]:
        import mujoco

        command = np.minimum(np.maximum(action, self._low), self._high)
        if self._pending:  # action latency (Randomization.action_latency_steps)
            self._pending.append(command)
            command = self._pending.popleft()
            if command.shape != (2,):  # the zeros MujocoDevice queued at reset
                command = np.zeros(2)
        goal = _clip_to_workspace(self.data.site_xpos[self._ee, :2] + self.config.max_step_m * command)
        self.data.mocap_pos[self._hand] = (goal[0], goal[1], EE_HEIGHT_M + HAND_OFFSET_M)
        mujoco.mj_step(self.model, self.data, nstep=self.control_substeps)
        return self._observation()

    def _on_estop(self) -> None:
        super()._on_estop()
        self.data.mocap_pos[self._hand, :2] = self.data.site_xpos[self._ee, :2]  # hold where it is


def make_device(config: ArmPushConfig = ArmPushConfig()) -> ArmPushDevice:
    return ArmPushDevice(config)


def make(config: ArmPushConfig = ArmPushConfig()):
    """(device, task) for the push task."""
    return make_device(config), Push(config)


CAMERA_SIZE = (64, 64)
"""The top camera's width and height in :func:`make_camera_device`."""


def make_camera_device() -> ArmPushDevice:
    """The push device with its top camera at 64 x 64 (1 cm a pixel) (a robot server's factory takes no arguments)."""
    return make_device(ArmPushConfig(camera=CAMERA_SIZE))


# -- scripted help ---------------------------------------------------------------------------

CONTACT_M = BLOCK_HALF_M + PUSHER_RADIUS_M
"""The pusher's centre this far behind the block's centre touches the block's face."""
PUSH_STEP_M = 0.012
"""The expert pushes this far per step (slower than it moves in free space: the block turns less)."""


def expert(observation, step: int = 0) -> np.ndarray:
    """A scripted expert: the action in ``[-1, 1]^2`` for ``observation`` (``step`` is unused).

    In the frame of the block-to-target line (``along`` toward the target, ``side`` across
    it): a pusher beside or in front of the block steps sideways clear of it, then back
    past it; a pusher behind it goes to the point on the line 2 cm short of touching the
    block's back face; a pusher at the back face and on the line pushes toward the target
    (1.2 cm a step), steering sideways back onto the line. Over hundreds of seeded
    episodes it succeeds in every one, in 25 steps on average (at most ~40 of the 50).
    """
    ee = np.asarray(observation["ee_pos"][:2], np.float64)
    block = np.asarray(observation["block_pos"][:2], np.float64)
    target = np.asarray(observation["target_pos"][:2], np.float64)
    line = target - block
    distance = float(np.linalg.norm(line))
    if distance < 1e-6:
        return np.zeros(2, np.float32)
    u = line / distance
    v = np.array([-u[1], u[0]])
    rel = ee - block
    along, side = float(rel @ u), float(rel @ v)
    clear = CONTACT_M + 0.02  # around the block's corners, with a margin
    if along > -CONTACT_M + 0.005:  # not behind the block's back face
        if abs(side) < clear:  # beside or in front of it: out sideways, away from the line
            sign = 1.0 if side >= 0 else -1.0
            move = v * sign * (clear + 0.01 - abs(side)) - u * 0.005
        else:  # clear of it sideways: back past it
            move = -u * (along + CONTACT_M + 0.03)
    elif abs(side) < 0.012 and along > -CONTACT_M - 0.03:
        # on the line at the back face: push, steering back onto the line
        move = u * PUSH_STEP_M - v * side
    else:  # behind: to the approach point on the line
        move = block - u * (CONTACT_M + 0.02) - ee
    action = move / 0.02
    largest = float(np.max(np.abs(action)))
    return (action / max(largest, 1.0)).astype(np.float32)  # keeps the direction


class Wander:
    """A scripted near miss: ``wander(observation, step) -> action``, the expert pushing the block
    toward a decoy target 8 to 20 cm from the real one, with noise.

    Its episodes are the failures a success classifier needs (``embodyrl reward train``): the
    block moved, often close to the target but not onto it, the arm in the poses pushing takes.
    The decoy and the noise are drawn at step 0 from ``seed`` and a count of episodes, so a
    recording is repeatable. Should the block pass over the target on the way, the task's own
    success signal labels the episode a success.
    """

    def __init__(self, seed: int = 0):
        self._rng = np.random.default_rng(seed)
        self._decoy = np.zeros(3)

    def __call__(self, observation, step: int) -> np.ndarray:
        if step == 0:
            target = np.asarray(observation["target_pos"], np.float64)
            angle, radius = self._rng.uniform(0, 2 * np.pi), self._rng.uniform(0.08, 0.20)
            decoy = target[:2] + radius * np.array([np.cos(angle), np.sin(angle)])
            self._decoy = np.array([*_clip_to_workspace(decoy), target[2]])
        aimed = expert({**observation, "target_pos": self._decoy.astype(np.float32)}, step)
        noisy = aimed + self._rng.normal(0.0, 0.3, 2)
        return np.clip(noisy, -1.0, 1.0).astype(np.float32)


wander = Wander()
"""The scripted near miss of ``script:embodyrl.envs.arm_push:wander``."""


@dataclass(frozen=True)
class Corridor:
    """Where the scripted person lets the policy act (see :class:`Person`); distances in xy."""

    drift_m: float = 0.06
    """Out when the pusher is further from the block than the closest it has been this
    episode plus this (the expert, going round the block, backs off up to ~4 cm)."""
    near_m: float = 0.06
    progress_m: float = 0.005
    stall_steps: int = 8
    """Out when the pusher, further than ``near_m`` from the block (touching it is 4 cm),
    has not come ``progress_m`` closer to it than ever before this episode for more than
    ``stall_steps`` consecutive observations (the expert: at most 6)."""
    away_m: float = 0.02
    """Out when the block is further from the target than the closest it has been this
    episode plus this (the expert never pushes it away)."""
    hold_steps: int = 12
    """Having taken over, the person keeps control for at least this many steps, and until
    the episode is back in the corridor."""


class Person:
    """A scripted person for interventions: ``person(observation, step) -> action or None``.

    Use it as the teleop source ``script:embodyrl.envs.arm_push:person`` (the module's
    instance :data:`person`; make one per device where several run in one process: it
    keeps per-episode state). ``step`` counts from 0 in each episode; step 0 starts a new
    episode (clears the state). Call it once per step, in order.

    The corridor (:class:`Corridor`; all distances in the table's plane), checked on every
    observation, step 0 included: the episode is *out* of it when

    * *drift*: the pusher is further from the block than the smallest pusher-block
      distance seen so far this episode (this observation included) plus ``drift_m``
      (6 cm), or
    * *stalling*: for more than ``stall_steps`` (8) consecutive observations the pusher
      has been further than ``near_m`` (6 cm) from the block without coming ``progress_m``
      (5 mm) closer to it than it had ever been this episode, or
    * *pushed away*: the block is further from the target than the smallest block-target
      distance seen so far this episode plus ``away_m`` (2 cm).

    On the first observation out of the corridor the person takes over: it returns
    :func:`expert`'s action on that step and every following one until it has acted for
    at least ``hold_steps`` (12) steps *and* the current observation is back in the
    corridor (as a person finishes a correction before letting go); on that observation
    it returns None again, and the policy acts until the next exit.

    The expert never leaves the corridor (over hundreds of seeded episodes its largest
    drift is ~4 cm, its longest stall 6 steps, and the block never moves away from the
    target), so the person never corrects it; a uniform random policy is corrected on
    roughly 40% of its steps, in one or two take-overs per episode.
    """

    def __init__(self, corridor: Corridor = Corridor()):
        self.corridor = corridor
        self.interventions = 0
        """Steps on which this person acted, since it was made."""
        self._new_episode()

    def _new_episode(self) -> None:
        self._closest = np.inf  # pusher to block
        self._closest_block = np.inf  # block to target
        self._stalled = 0
        self._held = 0  # steps acted in the current take-over; 0: the policy acts

    def in_corridor(self, observation) -> bool:
        """Whether ``observation`` is in the corridor; updates the episode's state (once a step)."""
        c = self.corridor
        gap = xy_distance(observation, "ee_pos", "block_pos")
        progress = gap < self._closest - c.progress_m
        self._stalled = 0 if progress or gap <= c.near_m else self._stalled + 1
        self._closest = min(self._closest, gap)
        distance = xy_distance(observation)
        self._closest_block = min(self._closest_block, distance)
        return (gap <= self._closest + c.drift_m and self._stalled <= c.stall_steps
                and distance <= self._closest_block + c.away_m)

    def __call__(self, observation, step: int) -> np.ndarray | None:
        if step == 0:
            self._new_episode()
        inside = self.in_corridor(observation)
        if self._held >= self.corridor.hold_steps and inside:
            self._held = 0  # let go
        if self._held == 0 and inside:
            return None
        self._held += 1
        self.interventions += 1
        return expert(observation, step)


person = Person()
"""The scripted person of ``script:embodyrl.envs.arm_push:person``."""
