import pytest

from embodyrl.config import TrainConfig, default_config, from_dict, load, save, to_dict


def test_round_trip_through_json(tmp_path):
    config = default_config("pendulum")
    save(config, tmp_path / "config.json")
    assert load(tmp_path / "config.json") == config


def test_task_defaults_apply():
    assert default_config("pendulum").ddpg.discount == 0.98
    assert TrainConfig().ddpg.discount == 0.99


@pytest.mark.parametrize(("change", "message"), [
    ({"stpes": 3}, "unknown config key stpes"),
    ({"ddpg": {"lr": 1.0}}, "unknown config key ddpg.lr"),
    ({"algorithm": "a2c"}, "algorithm: unknown 'a2c'"),
    ({"steps": "many"}, "steps: expected int"),
    ({"ddpg": {"hidden_sizes": 64}}, "ddpg.hidden_sizes: expected a list"),
    ({"learner": {"rate_tolerance": 1, "credit_quantum": 256}}, "rate_tolerance must be at least"),
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
