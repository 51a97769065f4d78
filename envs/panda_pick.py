"""gym-hil's PandaPickCube, as LeRobot's HIL-SERL trains it, with one scripted expert and person for
both systems.

`gym-hil <https://pypi.org/project/gym-hil/>`_ (LeRobot's MuJoCo Franka tasks; not a dependency of
embodyrl: it needs mujoco below 3.9, so it lives in the side-by-side experiment's own environment,
``examples/hilserl_side_by_side.py``) drives a Panda with a Robotiq gripper by end-effector deltas at
10 Hz, 100-step episodes. The cube (4 cm) rests at x 0.5, y 0; the sparse reward is 1 on the step the
cube is lifted 10 cm, which ends the episode, as does a cube pushed out of the sampling area.

:func:`register` adds ``embodyrl/PandaPickCube-v0``: gym-hil's own wrapper stack for
``gym_hil/PandaPickCube-v0`` (``GripperPenaltyWrapper`` then ``EEActionWrapper``) minus its one-second
sleep at every reset (``ResetDelayWrapper``, there so that a person at a viewer can see the reset), and
without the keyboard/gamepad wrapper: the scripted person below stands in for the person, on
embodyrl's side through ``--teleop script:embodyrl.envs.panda_pick:person`` and on LeRobot's side
through gym-hil's own intervention signals (``is_intervention``, ``teleop_action``), from the same
function.

Action (the wrapper's): ``(dx, dy, dz)`` in ``[-1, 1]`` (times 2.5 cm, the mocap target's move this
step) and the gripper in ``[0, 2]`` (1 holds; 2 closes it fully at once, 0 opens it fully; LeRobot's
SAC treats it as three discrete actions). Observation: ``state`` (gym-hil's ``agent_pos``, 18: joint
positions and velocities, the gripper command 0..255, the pinch point's xyz) and ``environment_state``
(the cube's xyz). The rename gives both systems the same feature names: embodyrl writes a field
``state`` as LeRobot's ``observation.state``, which is where LeRobot's gym-hil adapter puts
``agent_pos``.

:class:`Expert` picks the cube in every seeded episode in about 20 steps; :class:`Person` takes over
with it when the policy strays (the rule is on :class:`Person`). Both are pure numpy, so both
systems' processes import this module without gym-hil's or embodyrl's other dependencies.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ENV_ID = "embodyrl/PandaPickCube-v0"
BASE_ID = "gym_hil/PandaPickCubeBase-v0"
MAX_EPISODE_STEPS = 100
GRIPPER_PENALTY = -0.02
"""gym-hil's penalty for a gripper command that changes nothing; reported in ``info["discrete_penalty"]``
(LeRobot's discrete gripper critic adds it), not in the reward."""
STEP_M = 0.025
"""gym-hil's default end-effector step: an action of 1 moves the target this far."""
CLOSE, HOLD, OPEN = 2.0, 1.0, 0.0
"""Gripper actions (the wrapper's ``[0, 2]``: 2 adds the full command, 0 removes it)."""

TCP = slice(15, 18)
GRIP = 14


def tcp_position(observation) -> np.ndarray:
    return np.asarray(observation["state"][TCP], np.float64)


def cube_position(observation) -> np.ndarray:
    return np.asarray(observation["environment_state"], np.float64)


def gripper_closed(observation) -> bool:
    return float(observation["state"][GRIP]) > 127.5


def _towards(target: np.ndarray, tcp: np.ndarray) -> np.ndarray:
    move = (target - tcp) / STEP_M
    return np.clip(move, -1.0, 1.0)


@dataclass
class Expert:
    """A scripted pick: ``expert(observation, step) -> action`` (call once a step, in order; step 0
    starts an episode).

    Above the cube with the gripper open, down to it, close, wait ``settle_steps`` for the fingers,
    lift. It keeps the count of steps since it closed, as a person remembers what they did; the rest
    is read from the observation.
    """

    hover_m: float = 0.05
    """Height above the cube it moves in at, until within ``align_m`` of it in the plane."""
    align_m: float = 0.01
    grasp_m: float = 0.008
    """Closes when the pinch point is within this of the cube's centre (each axis of the plane, and
    height)."""
    settle_steps: int = 4

    def __post_init__(self):
        self.reset()

    def reset(self) -> None:
        """Forget the episode (a new one, or a take-over: the expert starts from what it sees)."""
        self._closed_for = 0

    def __call__(self, observation, step: int = 0) -> np.ndarray:
        if step == 0:
            self.reset()
        tcp, cube = tcp_position(observation), cube_position(observation)
        if gripper_closed(observation) and self._closed_for == 0:
            self._closed_for = 1  # closed before this expert acted (a policy did): wait, then lift
        if self._closed_for:
            self._closed_for += 1
            if self._closed_for <= self.settle_steps:
                return np.array([0.0, 0.0, 0.0, HOLD], np.float32)
            if np.linalg.norm(tcp[:2] - cube[:2]) > 0.03 or tcp[2] - cube[2] > 0.03:
                self._closed_for = 0  # holding nothing: open and start over
                return np.array([0.0, 0.0, 1.0, OPEN], np.float32)
            return np.array([0.0, 0.0, 1.0, HOLD], np.float32)
        planar = float(np.linalg.norm(tcp[:2] - cube[:2]))
        height = self.hover_m if planar > self.align_m else 0.0
        target = cube + np.array([0.0, 0.0, height])
        if planar <= self.align_m and abs(tcp[2] - cube[2]) <= self.grasp_m:
            self._closed_for = 1
            return np.array([0.0, 0.0, 0.0, CLOSE], np.float32)
        return np.array([*_towards(target, tcp), HOLD], np.float32)


@dataclass(frozen=True)
class Corridor:
    """Where the scripted person lets the policy act."""

    drift_m: float = 0.06
    """Out when the pinch point is further from the cube than the closest it has been this episode
    plus this."""
    near_m: float = 0.03
    progress_m: float = 0.005
    stall_steps: int = 10
    """Out when the pinch point, further than ``near_m`` from the cube, has not come ``progress_m``
    closer than ever before this episode for more than this many consecutive observations."""
    pushed_m: float = 0.03
    """Out when the cube has slid this far in the plane from where the episode started."""
    grasp_steps: int = 25
    """Out when the cube has not been lifted 2 cm by this many steps after the pinch point first came
    within ``near_m`` of it."""
    hold_steps: int = 8
    """Having taken over, the person keeps control for at least this many steps, and until the
    episode is back in the corridor."""


class Person:
    """A scripted person: ``person(observation, step) -> action or None`` (None: the policy acts).

    On the first observation out of the :class:`Corridor` (the policy drifting away from the cube,
    stalling short of it, pushing it, or failing to lift it once there) the person takes over with
    :class:`Expert`'s actions for at least ``hold_steps`` steps and until the episode is back in the
    corridor, then lets go. The expert never leaves the corridor, so it is never corrected.
    ``interventions`` counts the steps it acted.
    """

    def __init__(self, corridor: Corridor = Corridor()):
        self.corridor = corridor
        self.expert = Expert()
        self.interventions = 0
        self._new_episode(None)

    def _new_episode(self, observation) -> None:
        self._closest = np.inf
        self._stalled = 0
        self._held = 0
        self._near_since: int | None = None
        self._start = None if observation is None else cube_position(observation)

    def in_corridor(self, observation, step: int) -> bool:
        """Whether ``observation`` is in the corridor; updates the episode's state (once a step)."""
        c = self.corridor
        tcp, cube = tcp_position(observation), cube_position(observation)
        gap = float(np.linalg.norm(tcp - cube))
        progress = gap < self._closest - c.progress_m
        self._stalled = 0 if progress or gap <= c.near_m else self._stalled + 1
        self._closest = min(self._closest, gap)
        if gap <= c.near_m and self._near_since is None:
            self._near_since = step
        lifted = cube[2] - self._start[2] > 0.02
        slow_grasp = self._near_since is not None and step - self._near_since > c.grasp_steps and not lifted
        pushed = float(np.linalg.norm(cube[:2] - self._start[:2])) > c.pushed_m
        return (gap <= self._closest + c.drift_m and self._stalled <= c.stall_steps
                and not pushed and not slow_grasp)

    def __call__(self, observation, step: int) -> np.ndarray | None:
        if step == 0:
            self._new_episode(observation)
        inside = self.in_corridor(observation, step)
        if self._held >= self.corridor.hold_steps and inside:
            self._held = 0  # let go
        if self._held == 0 and inside:
            return None
        if self._held == 0:  # takes over: the expert starts from what it sees, with a fresh grasp deadline
            self.expert.reset()
            self._near_since = None
        self._held += 1
        self.interventions += 1
        return self.expert(observation, step)


expert = Expert()
"""The scripted pick of ``script:embodyrl.envs.panda_pick:expert``."""
person = Person()
"""The scripted person of ``script:embodyrl.envs.panda_pick:person``."""


EPISODE_LOG = "EMBODYRL_PANDA_PICK_EPISODES"
"""Where :func:`logged` appends one JSON line per episode, when this environment variable names a file."""
STEP_COUNT = "EMBODYRL_PANDA_PICK_STEPS"
"""Where :func:`logged` keeps the count of steps this process has taken (rewritten every step), when set:
the fault experiment reads what an actor took before it was killed, unfinished episode included."""


class EpisodeLog:
    """One JSON line per episode: ``wall`` (time.time() at its end), ``steps`` (environment steps so
    far, counted on from the file's last line, so a restarted process goes on), ``episode_steps``,
    ``success`` (the sparse reward paid), ``return`` and ``person_steps`` (the steps :data:`person`
    acted). An episode the time limit cut (outside this wrapper) is written at the next reset."""

    def __init__(self, path: Path):
        self.path = Path(path)
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        self.steps = json.loads(lines[-1])["steps"] if lines else 0
        self._open = False

    def start(self) -> None:
        self._open, self._steps, self._return, self._success = True, 0, 0.0, False
        self._person = person.interventions

    def step(self, reward: float, ended: bool) -> None:
        self.steps += 1
        self._steps += 1
        self._return += float(reward)
        self._success = self._success or reward >= 1.0
        if ended:
            self.end()

    def end(self) -> None:
        if not self._open or not self._steps:
            return
        row = {"wall": time.time(), "steps": self.steps, "episode_steps": self._steps, "success": self._success,
               "return": self._return, "person_steps": person.interventions - self._person}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self._open = False


def logged(env):
    """``env`` with its episodes appended to ``$EMBODYRL_PANDA_PICK_EPISODES`` (unchanged where unset)."""
    import gymnasium

    path = os.environ.get(EPISODE_LOG)
    if not path:
        return env
    log = EpisodeLog(Path(path))
    counter = os.environ.get(STEP_COUNT)
    taken = [0]

    class Logged(gymnasium.Wrapper):
        def reset(self, **kwargs):
            log.end()
            log.start()
            return self.env.reset(**kwargs)

        def step(self, action):
            result = self.env.step(action)
            log.step(result[1], result[2] or result[3])
            if counter:
                taken[0] += 1
                Path(counter).write_text(str(taken[0]))
            return result

    return Logged(env)


def with_success(env):
    """``info["is_success"]`` on every step (the sparse reward paid), as Gymnasium-Robotics reports it."""
    import gymnasium

    class Success(gymnasium.Wrapper):
        def step(self, action):
            observation, reward, terminated, truncated, info = self.env.step(action)
            return observation, reward, terminated, truncated, {**info, "is_success": reward >= 1.0}

    return Success(env)


def renamed(observation) -> dict:
    """gym-hil's observation with ``agent_pos`` named ``state``."""
    return {"state": observation["agent_pos"], "environment_state": observation["environment_state"]}


def make_env(**kwargs):
    """gym-hil's PandaPickCube under gym-hil's own wrappers, minus the reset sleep, ``agent_pos`` named
    ``state`` (needs gym-hil)."""
    import gymnasium
    from gym_hil.wrappers.factory import make_env as make_hil_env

    env = make_hil_env(BASE_ID, use_viewer=False, use_inputs_control=False, gripper_penalty=GRIPPER_PENALTY,
                       reset_delay_seconds=0.0, **kwargs)
    space = env.observation_space
    return with_success(logged(gymnasium.wrappers.TransformObservation(
        env, renamed, gymnasium.spaces.Dict({"state": space["agent_pos"],
                                             "environment_state": space["environment_state"]}))))


def register() -> str:
    """Register :data:`ENV_ID` with Gymnasium (idempotent; gym-hil is needed at make time only)."""
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(ENV_ID, entry_point=make_env, max_episode_steps=MAX_EPISODE_STEPS)
    return ENV_ID


with contextlib.suppress(ImportError):  # an edge without Gymnasium still reads the expert and the person
    register()  # gymnasium.make("embodyrl.envs.panda_pick:embodyrl/PandaPickCube-v0") imports this module first
