"""One learner service: off-policy, on-policy and coupling learners all run the same loop class,
write the same metrics path, and nothing else in the library polls the learner's server."""

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from embodyrl.config import LearnerConfig, TrainConfig
from embodyrl.envs import pendulum
from embodyrl.hal.layout import Layout
from embodyrl.learner import LearnerService, build_learner

ROOT = Path(__file__).resolve().parents[1]
SMALL = LearnerConfig(min_replay=10**9, checkpoint_every_s=3600, log_every_s=3600)


def _config(algorithm: str) -> TrainConfig:
    config = TrainConfig(steps=0, algorithm=algorithm, learner=SMALL)
    return dataclasses.replace(config, ddpg=dataclasses.replace(config.ddpg, hidden_sizes=(8,)),
                               sac=dataclasses.replace(config.sac, hidden_sizes=(8,)),
                               ppo=dataclasses.replace(config.ppo, hidden_sizes=(8,), rollout_length=4,
                                                       rollouts_per_iteration=2, minibatches=2))


@pytest.mark.parametrize("algorithm", ["ddpg", "ppo"])
def test_off_and_on_policy_learners_are_one_service_with_one_metrics_path(tmp_path, algorithm):
    spec, action = pendulum.OBSERVATION_SPEC, pendulum.make_device().action_spec
    learner = build_learner(_config(algorithm), Layout.of("pendulum", spec, action), tmp_path)
    assert type(learner) is LearnerService
    counters = learner.run()  # budget 0: publish, log, save, checkpoint, close
    assert counters.publications == 1
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for key in ("env_steps", "updates", "updates_per_s", "policy_version", "actors", "rejected",
                "messages_in", "bytes_in_per_s", "duplicates_dropped", "weights_sent", "rows_behind",
                "discarded", "batches_awaiting_commit"):
        assert key in record, key
    assert any((tmp_path / "tb").iterdir())  # TensorBoard for every kind
    assert (tmp_path / "policy" / "policy.json").exists() and (tmp_path / "checkpoints").is_dir()


def test_the_coupling_learner_runs_on_the_same_service():
    from embodyrl.coupling.learner import CouplingLearner, CouplingLearnerConfig
    from embodyrl.hal.coupling.link import CouplingConfig

    learner = CouplingLearner(CouplingConfig(levels=4, features=2), CouplingLearnerConfig(min_steps=10))
    try:
        assert type(learner.service) is LearnerService
    finally:
        learner.close()


def test_only_the_service_polls_the_learner_server():
    """The loop is written once: no other library module calls ``server.poll`` (benchmarks that
    measure the transport alone are exempt)."""
    pollers = []
    for path in (ROOT / "embodyrl").rglob("*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(("embodyrl/bench/", "embodyrl/transport/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "poll"
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "server"):
                pollers.append(f"{relative}:{node.lineno}")
    assert pollers == ["embodyrl/learner/service.py:" + pollers[0].split(":")[1]], pollers
