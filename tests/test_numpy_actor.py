"""An actor without JAX: the learner sends each device's policy graph at WELCOME, the actor acts with the
numpy runtime, as the JAX policy does (every registered algorithm), and its rows reach the replay."""

import dataclasses

import jax
import numpy as np
import pytest
import robot_helpers

from embodyrl import robot as robots
from embodyrl.algos import registry
from embodyrl.algos.heads import over
from embodyrl.cli import processes
from embodyrl.config import TrainConfig, default_config, from_dict, to_dict
from embodyrl.hal import params as flat_params
from embodyrl.hal.group import DeviceGroup
from embodyrl.hal.layout import Layout
from embodyrl.hal.runtime import NumpyPolicy
from embodyrl.hal.specs import ArraySpec
from embodyrl.hal.steps import PolicyVersion
from embodyrl.hal.wire.client import LearnerLink, LinkError
from embodyrl.hal.wire.protocol import DeviceInfo
from embodyrl.learner.policy_graphs import PolicyGraphs
from embodyrl.learner.testing import ServedLearner
from embodyrl.policy import JaxPolicy

TASK = "robot_helpers:point_mass"
DEVICE, _ = robot_helpers.point_mass()
CHOICES = ArraySpec("choice", (), np.int32, 0, 4)
VERSION = PolicyVersion(7, 3)


def observations(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"position": rng.uniform(-1, 1, 2).astype(np.float32),
             "velocity": rng.uniform(-0.3, 0.3, 2).astype(np.float32)} for _ in range(n)]


def both(name: str, layout: Layout | None = None, device_id: int = 0):
    """The JAX policy of ``name`` and the numpy policy built from the export the learner would send."""
    algorithm = registry.build(name)
    if layout is None:
        layout = Layout.of("point", DEVICE.observation_spec, CHOICES if name == "dqn" else DEVICE.action_spec)
    jax_policy = JaxPolicy(algorithm, layout, device_id, seed=3)
    weights = flat_params.flatten({"actor": jax.device_get(jax_policy.params)})
    graphs = PolicyGraphs(over(algorithm, layout), layout, lambda: (VERSION, weights))
    return jax_policy, NumpyPolicy(*graphs(device_id), seed=0)


@pytest.mark.parametrize("name", registry.names())
def test_every_algorithm_acts_alike_through_the_graph_the_learner_sends(name):
    jax_policy, numpy_policy = both(name)
    assert numpy_policy.version == VERSION
    for observation in observations(8):
        (a_jax, x_jax), (a_np, x_np) = (p.act(observation, explore=False) for p in (jax_policy, numpy_policy))
        np.testing.assert_allclose(a_np, a_jax, rtol=1e-5, atol=1e-5)
        assert set(x_np) == set(x_jax), name  # PPO's mode carries its log-probability in both
        if "log_prob" in x_jax:
            assert abs(x_np["log_prob"] - x_jax["log_prob"]) < 1e-5
        assert set(numpy_policy.act(observation, explore=True)[1]) == set(jax_policy.act(observation)[1])


def test_ppo_log_probabilities_of_numpy_samples_equal_jax():
    from embodyrl.algos.ppo import make_networks

    for spec in (DEVICE.action_spec, CHOICES):
        layout = Layout.of("point", DEVICE.observation_spec, spec)
        jax_policy, numpy_policy = both("ppo", layout)
        networks, _ = make_networks(layout.observation_spec, spec, registry.build("ppo").config, jax.random.key(0))
        compared = 0
        for observation in observations(48, seed=1):
            action, extras = numpy_policy.act(observation, explore=True)
            if spec.dtype == np.float32 and np.any(np.abs(action) >= 1.0):
                continue  # clipped to the bounds: the density is the unclipped sample's, in both runtimes
            one = {k: v[None] for k, v in observation.items()}
            expected = float(networks.log_prob(jax_policy.params, one, np.asarray(action)[None])[0])
            assert abs(extras["log_prob"] - expected) < 1e-5, (spec.name, extras, expected)
            compared += 1
        assert compared >= 8


class SameNoise:
    """A numpy Generator's ``normal`` that returns the noise the JAX side drew."""

    def __init__(self, z):
        self.z = np.asarray(z, np.float64)

    def normal(self, size=None):
        return self.z.reshape(size)


def test_sac_samples_and_log_probabilities_equal_jax_for_the_same_noise(monkeypatch):
    from embodyrl.algos.sac import make_networks

    jax_policy, numpy_policy = both("sac")
    layout = jax_policy.layout
    networks, _, _ = make_networks(layout.observation_spec, layout.action_spec, registry.build("sac").config,
                                   jax.random.key(0))
    half_range = (DEVICE.action_spec.maximum - DEVICE.action_spec.minimum) / 2
    for i, observation in enumerate(observations(8, seed=2)):
        z = np.random.default_rng(i).normal(size=2).astype(np.float32) * 1.5
        monkeypatch.setattr(jax.random, "normal", lambda key, shape, z=z: jax.numpy.asarray(z).reshape(shape))
        one = {k: v[None] for k, v in observation.items()}
        action, log_prob = (x[0] for x in networks.sample(jax_policy.params, one, jax.random.key(0)))
        numpy_policy.rng = SameNoise(z)
        got, extras = numpy_policy.act(observation, explore=True)
        np.testing.assert_allclose(got, action, rtol=1e-5, atol=1e-5)
        assert abs(extras["log_prob"] - (float(log_prob) - np.log(half_range).sum())) < 1e-4


@pytest.mark.parametrize("name", ["ddpg", "sac", "crossq", "ppo", "dqn"])
def test_exploration_statistics_match_jax(name):
    jax_policy, numpy_policy = both(name)
    observation = observations(1, seed=5)[0]
    draws = {label: np.array([p.act(observation, explore=True)[0] for _ in range(1500)], np.float64)
             for label, p in (("jax", jax_policy), ("numpy", numpy_policy))}
    if name == "dqn":  # epsilon-greedy: the greedy choice, else uniform over the 5
        greedy = int(numpy_policy.act(observation, explore=False)[0])
        rates = {k: float(np.mean(v == greedy)) for k, v in draws.items()}
        assert abs(rates["numpy"] - rates["jax"]) < 0.03, rates
        return
    np.testing.assert_allclose(draws["numpy"].mean(0), draws["jax"].mean(0), atol=0.05)
    np.testing.assert_allclose(draws["numpy"].std(0), draws["jax"].std(0), rtol=0.12, atol=0.01)


def test_a_device_of_a_several_kind_layout_gets_its_own_slice():
    layout = robots.load("pendulum+arm_reach").layout()
    for device_id in (0, 1):
        jax_policy, numpy_policy = both("sac", layout, device_id)
        kind = layout.kinds[device_id]
        rng = np.random.default_rng(device_id)
        for _ in range(4):
            observation = {name: rng.normal(size=kind.observation_spec[name].shape).astype(np.float32)
                           for name in kind.observation_spec}
            np.testing.assert_allclose(numpy_policy.act(observation, explore=False)[0],
                                       jax_policy.act(observation, explore=False)[0], rtol=1e-5, atol=1e-5)


# -- over the wire ------------------------------------------------------------------------------
def config_of(**actor) -> TrainConfig:
    data = to_dict(default_config(TASK))
    data["actor"].update({"send_every": 16, "random_steps": 0, **actor})
    return from_dict(TrainConfig, data)


@pytest.fixture
def served(tmp_path):
    """A learner service over the point mass's layout that publishes weights and sends policy graphs."""
    layout = robots.load(TASK).layout()
    algorithm = over(registry.build("ddpg"), layout)
    jax_policy = JaxPolicy(algorithm, layout, 0, seed=1)
    weights = flat_params.flatten({"actor": jax.device_get(jax_policy.params)})
    with ServedLearner(tmp_path, layout, weights=weights, run_id="numpy", incarnation=5) as learner:
        learner.server.policy_graphs = PolicyGraphs(algorithm, layout, lambda: (learner.service.version, weights))
        yield learner, jax_policy


def test_an_actor_without_jax_acts_on_the_learners_graph_and_its_rows_reach_the_replay(served, monkeypatch,
                                                                                        capsys):
    learner, jax_policy = served
    monkeypatch.setattr(processes, "actor_runtime", lambda: "numpy")
    processes.actor_main(dataclasses.asdict(config_of()), learner.endpoint, 0, max_steps=200)
    assert "acting with the numpy runtime" in capsys.readouterr().err
    assert learner.wait(lambda service: service.counters.rows >= 192)
    steps = [taken.steps for taken in learner.taken]
    assert sum(len(s) for s in steps) >= 192
    # every row acted by the learner's policy (its export, then the same published weights): within the
    # exploration noise (0.1 half ranges, here 0.1) of the JAX policy's deterministic action
    for batch in steps:
        acted = ~batch.final  # an episode's final row holds its last observation, no action
        assert set(batch.policy_incarnation[acted].tolist()) == {5} and set(batch.policy_count[acted].tolist()) == {1}
        for i in np.flatnonzero(acted):
            observation = {name: batch.observation[name][i] for name in batch.observation}
            mean = jax_policy.act(observation, explore=False)[0]
            assert np.all(np.abs(batch.proposed_action[i] - mean) < 0.6), (i, batch.proposed_action[i], mean)


def test_the_link_asks_for_graphs_and_a_learner_without_them_says_why(served, tmp_path):
    learner, _ = served
    device = DeviceInfo(0, "point_mass", DEVICE.observation_spec, DEVICE.action_spec)
    layout_name = robots.load(TASK).layout().kinds[0].name
    device = dataclasses.replace(device, name=layout_name)
    with LearnerLink(learner.endpoint, actor_name="a", actor_id=1, devices=[device], policy_graphs=True) as link:
        meta, arrays = link.policy_exports[0]
        assert meta["algo"] == "ddpg" and tuple(meta["policy_version"]) == (5, 1)  # the service's, when asked
        assert "actor/layers/0/kernel" in arrays and arrays["actor/layers/0/kernel"].flags.writeable
    with LearnerLink(learner.endpoint, actor_name="b", actor_id=2, devices=[device]) as link:
        assert link.policy_exports == {}  # a JAX actor does not ask: its WELCOME stays small
    learner.server.policy_graphs = None
    with LearnerLink(learner.endpoint, actor_name="c", actor_id=3, devices=[device], policy_graphs=True) as link:
        assert link.policy_exports == {0: "this learner sends no policy graphs"}
        group = DeviceGroup({"point": robot_helpers.point_mass()[0]}, {"point": 0})
        with pytest.raises(LinkError, match="no policy for device 0 .point.: this learner sends no policy graphs"):
            processes.numpy_policies(link, group, seed=0)


def test_an_export_that_fails_answers_the_actor_and_leaves_the_learner_serving(monkeypatch):
    from embodyrl.learner import policy_graphs

    def broken(*args):
        raise KeyError("conv9")

    monkeypatch.setattr(policy_graphs, "export_device", broken)
    layout = Layout.of("point", DEVICE.observation_spec, DEVICE.action_spec)
    graphs = PolicyGraphs(registry.build("ddpg"), layout, lambda: (VERSION, {}))
    for _ in range(2):  # asked again, the same answer (kept, not rebuilt)
        with pytest.raises(ValueError, match=r"cannot export 'point'.*conv9.*pip install 'embodyrl\[learner\]'"):
            graphs(0)
    with pytest.raises(ValueError, match="device 3 is not in this learner's layout"):
        PolicyGraphs(registry.build("ddpg"), robots.load("pendulum+arm_reach").layout(), lambda: (VERSION, {}))(3)
