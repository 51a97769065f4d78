"""A plain task is a layout with one device kind: ``a+b`` runs go through the same code.

Both tasks run through one function (``embodyrl.cli.launch.train``: learner and actor processes,
evaluation) and leave the same run-directory files, the same metrics keys (a return per
device kind included) and the same summary keys per device kind."""

import json

import pytest

from embodyrl.cli.launch import train
from embodyrl.config import build_config, default_config

SMALL = [("steps", "300"), ("eval_episodes", "1"), ("sac.hidden_sizes", "[16]"), ("sac.batch_size", "32"),
         ("learner.min_replay", "100"), ("actor.random_steps", "100"), ("actor.send_every", "32"),
         ("learner.log_every_s", "0.2")]


def _files(run_dir):
    return sorted(p.relative_to(run_dir).parts[0] for p in run_dir.iterdir())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for task in ("pendulum", "pendulum+arm_reach"):
        run_dir = tmp_path_factory.mktemp("one-path") / task
        config = build_config(default_config(task), None, [("algorithm", "sac"), *SMALL])
        summary = train(config, run_dir, quiet=True)
        out[task] = run_dir, summary
    return out


def test_one_and_several_device_kinds_leave_the_same_files_and_keys(runs):
    (single_dir, single), (several_dir, several) = runs["pendulum"], runs["pendulum+arm_reach"]
    assert _files(single_dir) == _files(several_dir)
    assert {"config.json", "metrics.jsonl", "summary.json", "policy", "checkpoints", "replay", "tb"} <= set(
        _files(single_dir))

    def keys(run_dir):
        record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
        return {k if not k.startswith("episode_return/") else "episode_return/<kind>" for k in record}, record

    single_keys, single_record = keys(single_dir)
    several_keys, several_record = keys(several_dir)
    assert single_keys == several_keys
    assert "episode_return/pendulum" in single_record  # one kind has its curve too
    assert {"episode_return/pendulum", "episode_return/arm_reach"} <= set(several_record)
    assert set(single["devices"]) == {"pendulum"} and set(several["devices"]) == {"pendulum", "arm_reach"}
    common = {"eval_return_mean", "random_return_mean", "eval_returns"}
    for figures in (*single["devices"].values(), *several["devices"].values()):
        assert common <= set(figures)
    assert single["eval_return_mean"] == single["devices"]["pendulum"]["eval_return_mean"]  # one kind: at the top
    assert {"env_steps", "wall_s", "eval_episodes", "devices"} <= set(single) & set(several)
