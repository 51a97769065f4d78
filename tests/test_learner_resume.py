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
    first.policy_age.published(19, 600)
    first.policy_age.taken(np.full(50, 19), 656)  # 50 rows acted 56 updates behind
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
    second.policy_age.published(21, 656)
    second.policy_age.taken(np.full(10, 21), 660)
    ages = second.policy_age.distribution()  # the run's, not only this start's
    assert (ages["rows"], ages["max"], ages["mean"]) == (60, 56, round((50 * 56 + 10 * 4) / 60, 2))
    second.server.close()
    second.data.replay.close()
