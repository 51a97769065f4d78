"""LeRobot's HIL-SERL actor (``lerobot.rl.actor``, unchanged) on gym-hil's PandaPickCube, with embodyrl's
scripted person speaking through gym-hil's own intervention signals.

Run in the side-by-side experiment's environment (``examples/hilserl_side_by_side.py`` makes it) as
``python examples/hilserl_lerobot_actor.py --config_path CONFIG``, in place of
``python -m lerobot.rl.actor --config_path CONFIG``. Before LeRobot's actor starts it registers the
Gymnasium id ``gym_hil/PandaPickCubeScripted-v0`` (the config's ``env.task``), which LeRobot's
``make_robot_env`` makes as it makes any gym-hil task. Two things differ from gym-hil's own
``PandaPickCubeKeyboard-v0``, and both are the same on embodyrl's side:

* the person is :data:`embodyrl.envs.panda_pick.person`, behind gym-hil's ``InputController``
  interface (``should_intervene``, ``get_deltas``, the gripper command), so gym-hil's
  ``InputsControlWrapper`` reports ``is_intervention`` and ``teleop_action`` as for a gamepad;
* observations are state (LeRobot 0.4.4 asks gym-hil for camera images and a viewer window; no
  display is here, and both systems learn from the same 21 numbers), and there is no one-second
  sleep at reset.

Each episode is appended to ``$EMBODYRL_PANDA_PICK_EPISODES`` by the same code as on embodyrl's side
(:class:`embodyrl.envs.panda_pick.EpisodeLog`).
"""

from __future__ import annotations

import gymnasium
import numpy as np
from gym_hil.envs import PandaPickCubeGymEnv
from gym_hil.wrappers import intervention_utils
from gym_hil.wrappers.factory import wrap_env
from hilserl_side_by_side import LEROBOT_TASK

from embodyrl.envs import panda_pick


class ScriptedController(intervention_utils.InputController):
    """gym-hil's controller interface over the scripted person: it reads the env's observation each
    step, as a person at a gamepad watches the arm."""

    env: PandaPickCubeGymEnv | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step = 0
        self.action: np.ndarray | None = None

    def reset(self):
        self.step = 0

    def update(self):
        observation = panda_pick.renamed(self.env._compute_observation())
        self.action = panda_pick.person(observation, self.step)
        self.step += 1
        self.intervention_flag = self.action is not None
        gripper = panda_pick.HOLD if self.action is None else float(self.action[3])
        # gym-hil turns "open" into 2.0 and "close" into 0.0 (its names for the two ends of [0, 2])
        self.open_gripper_command = gripper == panda_pick.CLOSE
        self.close_gripper_command = gripper == panda_pick.OPEN

    def get_deltas(self):
        if self.action is None:
            return 0.0, 0.0, 0.0
        return tuple(float(v) for v in self.action[:3])


def make_scripted(use_gripper: bool = True, gripper_penalty: float = panda_pick.GRIPPER_PENALTY, **_asked):
    """What LeRobot's ``make_robot_env`` gets for ``gym_hil/PandaPickCubeScripted-v0``. ``_asked``
    (``image_obs=True``, ``render_mode="human"``) is not followed: state observations, no viewer."""
    base = PandaPickCubeGymEnv(image_obs=False)
    intervention_utils.KeyboardController = ScriptedController  # InputsControlWrapper makes this class
    env = wrap_env(base, use_viewer=False, use_gamepad=False, use_gripper=use_gripper, use_inputs_control=True,
                   gripper_penalty=gripper_penalty, reset_delay_seconds=0.0)
    wrapper = env
    while not isinstance(getattr(wrapper, "controller", None), ScriptedController):
        wrapper = wrapper.env
    wrapper.controller.env = base
    return panda_pick.logged(env)


def main() -> None:
    gymnasium.register(f"gym_hil/{LEROBOT_TASK}", entry_point=make_scripted,
                       max_episode_steps=panda_pick.MAX_EPISODE_STEPS)
    from lerobot.rl.actor import actor_cli

    actor_cli()


if __name__ == "__main__":
    main()
