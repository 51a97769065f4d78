import pytest

from embodyrl.config import TrainConfig, default_config, from_dict, load, save, to_dict


def test_round_trip_through_json(tmp_path):
    config = default_config("pendulum")
    save(config, tmp_path / "config.json")
    assert load(tmp_path / "config.json") == config


def test_task_defaults_apply():
    pendulum = default_config("pendulum")
    assert pendulum.algorithm == "sac" and pendulum.steps == 30_000 and pendulum.sac.discount == 0.99
    assert TrainConfig().algorithm == "ddpg" and TrainConfig().steps == 20_000
    cheetah = default_config("gym:HalfCheetah-v5")  # the measured CrossQ, not the paper's GPU width
    assert cheetah.algorithm == "crossq" and cheetah.steps == 50_000 and cheetah.crossq.critic_hidden_sizes == (256, 256)
    assert cheetah.actor.random_steps == cheetah.learner.min_replay == 5_000
    learner = cheetah.learner  # CrossQ's younger policy, from its registry entry
    assert (learner.rate_tolerance, learner.credit_quantum, learner.publish_every) == (256, 128, 16)
    assert default_config("gym:Hopper-v5").algorithm == "ddpg"  # a task not measured keeps the generic default


@pytest.mark.parametrize(("change", "message"), [
    ({"stpes": 3}, "unknown config key stpes"),
    ({"ddpg": {"lr": 1.0}}, "unknown config key ddpg.lr"),
    ({"algorithm": "a2c"}, "algorithm: unknown 'a2c'"),
    ({"steps": "many"}, "steps: expected int"),
    ({"ddpg": {"hidden_sizes": 64}}, "ddpg.hidden_sizes: expected a list"),
    ({"learner": {"rate_tolerance": 1, "credit_quantum": 256}}, "rate_tolerance must be at least"),
    ({"learner": {"rate_tolerance": 256, "credit_quantum": 64}}, r"credit_quantum \(64\) must hold one batch"),
])
def test_bad_config_names_the_key(change, message):
    data = to_dict(TrainConfig())
    for key, value in change.items():
        if isinstance(value, dict):
            data[key].update(value)
        else:
            data[key] = value
    with pytest.raises(ValueError, match=message):
        from_dict(TrainConfig, data)


def test_the_stacked_pixel_task_defaults_to_the_documented_run_that_solved_it():
    """``embodyrl train pendulum_pixels_stacked`` runs SAC with examples/configs/pixels_sac.yaml's settings."""
    from pathlib import Path

    from embodyrl import envs
    from embodyrl.algos.encoders import image_fields
    from embodyrl.config import _merge, load_yaml

    defaults = default_config("pendulum_pixels_stacked")
    documented = to_dict(TrainConfig(task="pendulum_pixels_stacked", algorithm="sac"))
    _merge(documented, load_yaml(Path(__file__).parents[1] / "examples" / "configs" / "pixels_sac.yaml"))
    documented = from_dict(TrainConfig, documented)
    assert defaults.algorithm == "sac"
    got, want = to_dict(defaults), to_dict(documented)
    for config in (got, want):
        config["sac"]["encoder"].pop("image_fields")
    assert got["sac"] == want["sac"] and got["learner"] == want["learner"] and got["steps"] == want["steps"]
    device, _ = envs.make("pendulum_pixels_stacked")  # "auto" finds the one camera the run named
    assert image_fields(device.observation_spec, defaults.sac.encoder) == documented.sac.encoder.image_fields
    assert default_config("pendulum_pixels").sac.encoder.pixels_only is False  # one frame: the state stays in


def test_a_saved_run_that_predates_a_changed_default_keeps_what_it_ran_with(tmp_path):
    """config.json written before TD3's targets stopped waiting for its actor has no such keys:
    loading it gives the behaviour it trained with; a new run's keys are kept."""
    import json

    path = tmp_path / "config.json"
    save(TrainConfig(task="pendulum"), path)
    assert (load(path).ddpg.delay_targets, load(path).ddpg.actor_q) == (False, "min")
    old = json.loads(path.read_text())
    for key in ("delay_targets", "actor_q"):
        del old["ddpg"][key]
    path.write_text(json.dumps(old))
    assert (load(path).ddpg.delay_targets, load(path).ddpg.actor_q) == (True, "first")
