"""A learner stopped and started again on its run directory continues: state, counters, replay."""

import dataclasses

import jax
import numpy as np

from embodyrl.config import LearnerConfig, TrainConfig
from embodyrl.envs import pendulum
from embodyrl.hal.layout import Layout
from embodyrl.learner import build_learner


def test_restart_restores_state_counters_and_replay(tmp_path):
    lc = LearnerConfig(min_replay=10**9, checkpoint_every_s=3600)
    config = dataclasses.replace(TrainConfig(steps=0, learner=lc), ddpg=dataclasses.replace(
        TrainConfig().ddpg, hidden_sizes=(16,)))
    spec, action = pendulum.OBSERVATION_SPEC, pendulum.make_device().action_spec
    first = build_learner(config, Layout.of("pendulum", spec, action), tmp_path)
    assert not first.resumed
    first.state = first.state._replace(steps=first.state.steps + 41)
    first.counters.updates, first.counters.env_steps, first.counters.publications = 656, 1234, 20
    first.run()  # budget 0: publishes, saves the policy and a checkpoint, closes
    saved = jax.device_get(first.state.actor_params)
    second = build_learner(config, Layout.of("pendulum", spec, action), tmp_path)
    assert second.resumed
    assert second.incarnation != first.incarnation  # versions never repeat across restarts
    assert (second.counters.updates, second.counters.env_steps) == (656, 1234)
    assert second.counters.publications == first.counters.publications
    assert int(second.state.steps) == 41
    for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(jax.device_get(second.state.actor_params)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert second.data.limiter.samples == 656
    second.server.close()
    second.data.replay.close()
