"""Config from YAML and dotted command-line overrides: typed values, errors that name the key."""

import pytest

from embodyrl.cli.commands import _overrides
from embodyrl.config import build_config, default_config, parse_override
from tests.cli_helpers import in_process


def test_override_values_take_the_field_type():
    assert parse_override("ddpg.actor_lr", "3e-4") == {"ddpg": {"actor_lr": 3e-4}}  # YAML would keep a str
    assert parse_override("learner.updates_per_step", "2") == {"learner": {"updates_per_step": 2.0}}
    assert parse_override("steps", "5_000") == {"steps": 5000}
    assert parse_override("algorithm", "sac") == {"algorithm": "sac"}
    assert parse_override("ddpg.hidden_sizes", "[64, 32]") == {"ddpg": {"hidden_sizes": [64, 32]}}
    config = build_config(default_config("pendulum"), None, [("ddpg.actor_lr", "3e-4"),
                                                               ("ddpg.hidden_sizes", "[64, 32]")])
    assert config.ddpg.actor_lr == 3e-4 and config.ddpg.hidden_sizes == (64, 32)
    assert type(config.learner.updates_per_step) is float


@pytest.mark.parametrize(("key", "raw", "named"), [
    ("ddpg.actor_lrx", "1", "ddpg.actor_lrx"),
    ("nosuch.field", "1", "nosuch.field"),
    ("steps.more", "1", "steps.more"),
    ("ddpg", "1", "ddpg"),
    ("learner.updates_per_step", "fast", "learner.updates_per_step"),
    ("seed", "1.5", "seed"),
    ("ddpg.hidden_sizes", "64", "ddpg.hidden_sizes"),
])
def test_bad_overrides_name_the_key(key, raw, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        build_config(default_config("pendulum"), None, [(key, raw)])


def test_yaml_merges_over_task_defaults_then_overrides_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 700\nddpg:\n  actor_lr: 1.0e-3\n  batch_size: 64\nlearner:\n  n_step: 3\n")
    config = build_config(default_config("pendulum"), path, [("ddpg.batch_size", "32")])
    assert config.steps == 700 and config.ddpg.actor_lr == 1e-3 and config.learner.n_step == 3
    assert config.ddpg.batch_size == 32  # the command line beats the file
    assert config.algorithm == "sac"  # pendulum's tuned default survives a file that does not set it


@pytest.mark.parametrize(("text", "named"), [
    ("ddpg:\n  actorlr: 1\n", "ddpg.actorlr"),
    ("learner:\n  n_step: two\n", "learner.n_step"),
    ("ddpg: 3\n", "ddpg"),
    ("task: arm\n", "task"),
    ("- a\n- b\n", "mapping"),
    ("steps: [1\n", "YAML"),
    ("learner:\n  n_step: 0\n", "learner.n_step"),  # the dataclass's own validation
])
def test_bad_yaml_names_the_key(tmp_path, text, named):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        build_config(default_config("pendulum"), path)


def test_override_argument_forms():
    assert _overrides(["--a.b", "1", "--c.d=x=y", "--e-f", "-2"]) == [("a.b", "1"), ("c.d", "x=y"),
                                                                      ("e_f", "-2")]
    with pytest.raises(ValueError, match="no value"):
        _overrides(["--a.b"])
    with pytest.raises(ValueError, match="unexpected argument"):
        _overrides(["stray"])


def test_train_rejects_bad_config_with_exit_2_before_starting(tmp_path):
    run_dir = tmp_path / "run"
    proc = in_process("train", "pendulum", "--run-dir", str(run_dir), "--ddpg.actor_lrx", "1")
    assert proc.returncode == 2
    assert "ddpg.actor_lrx" in proc.stderr and "actor_lr" in proc.stderr  # the known keys are listed
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner:\n  updates_per_step: lots\n")
    proc = in_process("train", "pendulum", "--run-dir", str(run_dir), "--config", str(bad))
    assert proc.returncode == 2 and "learner.updates_per_step" in proc.stderr
    proc = in_process("train", "pendulum", "--run-dir", str(run_dir), "--config", str(tmp_path / "none.yaml"))
    assert proc.returncode == 2 and "none.yaml" in proc.stderr
    assert not run_dir.exists()  # nothing was written for a rejected config


def test_other_commands_reject_unknown_options():
    proc = in_process("replay", ".", "--ddpg.actor_lr", "1")
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr


def test_help_lists_every_command():
    proc = in_process("--help")
    assert proc.returncode == 0
    for command in ("train", "eval", "replay", "plot", "bench", "keys"):
        assert command in proc.stdout
    proc = in_process("train", "--help")
    assert "--config" in proc.stdout and "--ddpg.actor_lr" in proc.stdout and "exit codes" in proc.stdout
