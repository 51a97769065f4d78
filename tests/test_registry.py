"""One registry and one algorithm interface: what every algorithm offers, and who reads the table."""

import dataclasses

import jax
import numpy as np
import pytest

from embodyrl.algos import registry
from embodyrl.algos.crossq import CrossQConfig
from embodyrl.algos.ddpg import DDPGConfig
from embodyrl.algos.dqn import DQNConfig
from embodyrl.algos.heads import over
from embodyrl.algos.interface import CONTINUOUS, DISCRETE, Algorithm, action_space, refusal
from embodyrl.algos.ppo import PPOConfig
from embodyrl.algos.sac import SACConfig
from embodyrl.config import TrainConfig, build_config, default_config, from_dict, to_dict
from embodyrl.hal import runtime
from embodyrl.hal.layout import DeviceKind, Layout
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import PolicyVersion

OBS = DictSpec.of(ArraySpec("pos", (3,), np.float32), ArraySpec("vel", (2,), np.float32))
SPACES = {CONTINUOUS: ArraySpec("action", (2,), np.float32, [-2.0, 0.0], [2.0, 1.0]),
          DISCRETE: ArraySpec("action", (), np.int64, 0, 3)}
MEMBERS = ("name", "config", "on_policy", "action_spaces", "batch_size", "discount", "init", "make_update_many",
           "actor_networks", "actor_params", "act", "mean_action", "export")


def _small(name: str) -> Algorithm:
    entry = registry.get(name)
    wide = {f.name for f in dataclasses.fields(entry.config_type)} & {"critic_hidden_sizes"}  # CrossQ's critics
    return registry.build(name, entry.config_type(hidden_sizes=(8,), **dict.fromkeys(wide, (8,))))


def _observations(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {s.name: rng.normal(size=(n, *s.shape)).astype(np.float32) for s in OBS.specs}


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_algorithm_implements_the_interface(name):
    algorithm = _small(name)
    assert isinstance(algorithm, Algorithm) and all(hasattr(algorithm, m) for m in MEMBERS)
    assert algorithm.name == name and isinstance(algorithm.on_policy, bool)
    assert algorithm.action_spaces and algorithm.action_spaces <= {CONTINUOUS, DISCRETE}
    assert algorithm.batch_size > 0 and 0 < algorithm.discount <= 1
    assert isinstance(algorithm.config, registry.get(name).config_type)
    key = jax.random.key(0)
    obs = _observations(4)
    for space in sorted(algorithm.action_spaces):
        spec = SPACES[space]
        networks, state = algorithm.init(key, OBS, spec)
        actor = algorithm.actor_params(state)
        _, fresh = algorithm.actor_networks(OBS, spec, key)
        assert jax.tree.structure(actor) == jax.tree.structure(fresh)  # what is published fits an actor
        for explore in (True, False):
            action, extras = algorithm.act(networks, actor, obs, key, explore)
            assert action.shape == (4, *spec.shape) and isinstance(extras, dict)
        # the numpy runtime's export acts as the JAX policy does
        policy = runtime.NumpyPolicy(*algorithm.export(networks, actor, PolicyVersion(0, 1)), seed=0)
        np.testing.assert_allclose(policy.mean_action(obs), algorithm.mean_action(networks, actor, obs),
                                   rtol=1e-5, atol=1e-5)
        assert policy.graph["algo"] == registry.get(name).section
        if not algorithm.on_policy:  # one update on batches shaped as the replay samples them
            rng = np.random.default_rng(1)
            batch = {"observation": _observations(2 * 8), "next_observation": _observations(2 * 8, 1),
                     "action": (rng.integers(0, 4, 16) if space == DISCRETE
                                else rng.uniform(-1, 1, (16, 2))).astype(np.float32),
                     "reward": rng.normal(size=16).astype(np.float32),
                     "discount": np.full(16, 0.99, np.float32)}
            batches = jax.tree.map(lambda x: x.reshape(2, 8, *x.shape[1:]), batch)
            _, metrics = algorithm.make_update_many(networks)(state, batches)
            assert all(np.isfinite(float(np.mean(v))) for v in jax.tree.leaves(metrics))
    for space, spec in SPACES.items():
        reason = refusal(algorithm, spec)
        assert (reason is None) == (space in algorithm.action_spaces)
        if reason is not None:
            assert reason == (f"{name} acts on {' or '.join(sorted(algorithm.action_spaces))} actions; "
                              f"the task's action 'action' is {space}")


def test_the_cli_and_the_config_offer_what_the_registry_holds():
    from embodyrl.cli.commands import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for command in ("train", "learner"):
        option = next(a for a in commands[command]._actions if a.dest == "algorithm")
        assert tuple(option.choices) == registry.names()
        assert all(name in commands[command].format_help() for name in registry.names())
    fields = [(f.name, f.type) for f in dataclasses.fields(TrainConfig)]
    assert [name for name, _ in fields] == ["task", "steps", "seed", "actors", "eval_episodes", "eval_every",
                                            "synchronous", "algorithm", "console", "console_key", "robot",
                                            *registry.sections(), "learner", "actor"]
    assert dict(fields[11:-2]) == registry.sections()
    assert list(to_dict(TrainConfig())) == [name for name, _ in fields]  # config.json's key order
    for name in registry.names():
        config = TrainConfig(algorithm=name)
        assert config.algo == registry.build(name, getattr(config, registry.get(name).section))


def test_lookups_by_name_and_by_config_type():
    assert registry.names() == ("ddpg", "td3", "sac", "rlpd", "crossq", "ppo", "dqn")
    assert registry.sections() == {"ddpg": DDPGConfig, "sac": SACConfig, "crossq": CrossQConfig, "ppo": PPOConfig,
                                   "dqn": DQNConfig}
    with pytest.raises(ValueError, match="unknown algorithm 'a2c'; known: ddpg, td3, sac, rlpd, crossq, ppo, dqn"):
        registry.get("a2c")
    for config, name in ((DDPGConfig(), "ddpg"), (SACConfig(), "sac"), (CrossQConfig(), "crossq"),
                         (PPOConfig(), "ppo"), (DQNConfig(), "dqn")):
        algorithm = registry.as_algorithm(config)
        assert algorithm.name == name and algorithm.config == config and registry.as_algorithm(algorithm) is algorithm
    with pytest.raises(TypeError):
        registry.as_algorithm("td3")
    assert registry.build("td3").config.num_critics == 2 and registry.build("rlpd").config.num_critics == 10
    assert action_space(SPACES[DISCRETE]) == DISCRETE and action_space(SPACES[CONTINUOUS]) == CONTINUOUS


def test_only_the_entries_that_support_layouts_train_several_device_kinds():
    action = ArraySpec("action", (2,), np.float32, -1, 1)
    layout = Layout((DeviceKind("a", OBS, SPACES[CONTINUOUS]), DeviceKind("b", OBS, action)))
    assert registry.heterogeneous() == ("ddpg", "td3", "sac", "rlpd")
    for name in registry.names():
        plain = _small(name)
        assert over(plain, Layout.of("a", OBS, SPACES[CONTINUOUS])) is plain  # one kind: the algorithm itself
        if name in registry.heterogeneous():
            assert over(_small(name), layout).layout is layout
        else:
            with pytest.raises(ValueError, match=f"\\(ddpg, td3, sac or rlpd\\), not {name}"):
                over(_small(name), layout)


def test_the_algorithm_implies_its_actor_settings_unless_the_user_set_them(tmp_path):
    base = default_config("pendulum")
    assert (base.actor.random_steps, base.actor.act_within_credit) == (1000, False)
    ppo = build_config(base, None, [("algorithm", "ppo")])
    assert (ppo.actor.random_steps, ppo.actor.act_within_credit) == (0, True)
    assert build_config(base, None, [("algorithm", "ppo"), ("actor.random_steps", "5")]).actor.random_steps == 5
    path = tmp_path / "c.yaml"
    path.write_text("algorithm: ppo\nactor:\n  act_within_credit: false\n")
    from_yaml = build_config(base, path)
    assert (from_yaml.actor.random_steps, from_yaml.actor.act_within_credit) == (0, False)
    assert build_config(base, None, [("algorithm", "sac")]).actor == base.actor


def test_an_old_config_without_the_dqn_section_still_loads(tmp_path):
    data = to_dict(default_config("pendulum"))
    del data["dqn"]
    assert from_dict(TrainConfig, data) == default_config("pendulum")


def test_train_refuses_an_algorithm_whose_action_space_does_not_fit_the_task(tmp_path, capsys):
    from embodyrl.cli.commands import main

    run = tmp_path / "run"
    assert main(["train", "pendulum", "--algorithm", "dqn", "--steps", "10", "--run-dir", str(run)]) == 2
    assert ("embodyrl: task 'pendulum': dqn acts on discrete actions; the task's action 'action' is continuous"
            in capsys.readouterr().err)
    assert not run.exists()  # refused before anything is written


def test_a_resumed_run_with_rows_in_its_replay_records_no_second_warm_up_and_draws_new_episodes(tmp_path):
    from embodyrl import envs
    from embodyrl.cli.commands import _resolve_config, build_parser
    from embodyrl.cli.processes import actor_seed
    from embodyrl.config import save
    from embodyrl.hal.steps import StepRecorder
    from embodyrl.replay import PersistentReplay
    from embodyrl.replay.contents import rows_added

    run = tmp_path / "run"
    run.mkdir()
    save(default_config("pendulum"), run / "config.json")

    def resolved(*extra):
        args, rest = build_parser().parse_known_args(["train", "pendulum", "--resume", "--run-dir", str(run), *extra])
        args.overrides = rest
        return _resolve_config(args, run)

    fresh = resolved().actor
    assert rows_added(run / "replay") == 0 and fresh.random_steps == 1000 and fresh.resumed_at_rows == 0
    device, _ = envs.make("pendulum")
    replay = PersistentReplay(run / "replay", device.observation_spec, device.action_spec, capacity=64, chunk_rows=16)
    recorder = StepRecorder(device.observation_spec, device.action_spec, actor_id=0, device_id=0)
    with device:
        observation = device.reset(seed=0)
        for _ in range(5):
            action = np.zeros(device.action_spec.shape, np.float32)
            recorder.add(observation, action, action, 0.0, False, False, PolicyVersion(0, 0))
            observation = device.step(action)
    replay.add(recorder.flush())
    replay.commit()
    replay.close()
    assert rows_added(run / "replay") == 5
    resumed = resolved().actor
    assert resumed.random_steps == 0 and resumed.resumed_at_rows == 5
    # a new run's actors keep their seeds; a resumed start's differ from the first start's and each other's
    assert actor_seed(3, 1) == 3001
    seeds = {actor_seed(3, index, rows) for index in (0, 1) for rows in (0, 5, 6)}
    assert len(seeds) == 6 and all(0 <= seed < 2**63 for seed in seeds)
    assert actor_seed(3, 1, 5) == actor_seed(3, 1, 5)  # reproducible
    assert resolved("--actor.random_steps", "7").actor.random_steps == 7  # the command line still decides
