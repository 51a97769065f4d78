"""Step budgets: a run that could not learn within its budget is refused at start, and a run stops
within one batch per actor of the steps asked."""

import threading

import pytest

from embodyrl import envs
from embodyrl.config import build_given, default_config, warm_up_refusal
from embodyrl.hal.actor import ActorConfig, ActorLoop
from embodyrl.hal.wire.client import LearnerLink
from embodyrl.hal.wire.protocol import DeviceInfo
from embodyrl.learner.testing import ServedLearner
from tests.cli_helpers import in_process
from tests.robot_helpers import Alternating


def refusal(*overrides, yaml=None, task="pendulum", implied=None):
    """What the warm-up check says of ``task`` with ``overrides`` (pairs) and a YAML file."""
    config, given = build_given(default_config(task), yaml, list(overrides))
    return warm_up_refusal(config, given, implied or {})


# -- refused at start ---------------------------------------------------------------------------

def test_a_budget_within_both_warm_ups_is_refused_naming_both_settings_and_what_to_set():
    reason = refusal(("steps", "600"), ("algorithm", "sac"))
    assert "learner.min_replay = 1000" in reason and "no update would happen" in reason
    assert "actor.random_steps = 1000" in reason and "no step would be acted by a learned policy" in reason
    assert "--actor.random_steps 150 --learner.min_replay 150" in reason


def test_the_rule_at_its_edges():
    assert refusal(("steps", "1000")) is not None  # the replay never holds 1000 steps before the end
    assert refusal(("steps", "1001")) is None
    assert refusal(("steps", "2500"), ("actors", "3")) is not None  # each actor's first 1000 are random
    assert "each of 3 actors" in refusal(("steps", "2500"), ("actors", "3"))
    assert refusal(("steps", "3001"), ("actors", "3")) is None


def test_ppo_keeps_no_replay_and_takes_no_random_warm_up():
    assert refusal(("steps", "600"), ("algorithm", "ppo")) is None
    assert refusal(("steps", "600"), ("algorithm", "ppo"), ("actor.random_steps", "800")) is None  # given


def test_a_setting_given_explicitly_runs_as_set_even_at_its_default_value(tmp_path):
    assert refusal(("steps", "600"), ("actor.random_steps", "1000"), ("learner.min_replay", "1000")) is None
    yaml = tmp_path / "short.yaml"
    yaml.write_text("learner:\n  min_replay: 1000\nactor:\n  random_steps: 1000\n")
    assert refusal(("steps", "600"), yaml=yaml) is None
    implied = {"actor": {"random_steps": 1000}, "learner": {"min_replay": 1000}}  # as a robot file's defaults
    assert refusal(("steps", "600"), implied=implied) is None


def test_one_setting_given_still_refuses_for_the_other_naming_only_it():
    reason = refusal(("steps", "600"), ("actor.random_steps", "100"))
    assert "learner.min_replay" in reason and "acts at random" not in reason
    reason = refusal(("steps", "600"), ("learner.min_replay", "100"))
    assert "actor.random_steps = 1000" in reason and "no update would happen" not in reason


@pytest.mark.parametrize("command", [["train", "pendulum"], ["learner", "pendulum"],
                                     ["launch", "local", "pendulum"], ["launch", "slurm", "pendulum", "--dry-run"]])
def test_train_learner_and_launch_refuse_before_writing_anything(tmp_path, command):
    run_dir = tmp_path / "run"
    result = in_process(*command, "--steps", "600", "--run-dir", run_dir, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "actor.random_steps" in result.stderr and "learner.min_replay" in result.stderr
    assert not run_dir.exists()


# -- stopped within a batch per actor -------------------------------------------------------------

def act_until_goodbye(endpoint, actor_id, send_every, results):
    device, task = envs.make("pendulum")
    info = DeviceInfo(0, "pendulum", device.observation_spec, device.action_spec)
    link = LearnerLink(endpoint, actor_name=f"budget-{actor_id}", actor_id=actor_id, devices=[info],
                       handshake_timeout_s=20, peer_timeout_s=20)
    with device, link:
        config = ActorConfig(actor_id=actor_id, send_every=send_every, random_steps=0, seed=actor_id,
                             credit_timeout_s=30)
        stats = ActorLoop(device, task, Alternating(), link, config).run(max_steps=5000)
        results[actor_id] = (stats.env_steps, link.bye_reason)


def test_a_slow_learner_grants_no_credit_past_the_budget_and_stops_within_a_batch_per_actor(tmp_path):
    """The learner grants rows freely (no training here, as a replay warming up); while it is busy
    (a training call, a compile) its actors send all the credit they hold, so without the budget's
    bound it took 256-row quanta per actor past the budget."""
    budget, send_every, actors = 1000, 16, 2
    granted = []
    with ServedLearner(tmp_path / "learner", envs.layout("pendulum"), run_id="budget", incarnation=5,
                       peer_timeout_s=20) as learner:
        grant = learner.server.grant

        def recording(session, credits):
            granted.append(credits)
            grant(session, credits)

        def within(service):
            service.budget, service.batch_rows = budget, send_every
            service.server.grant = recording

        learner.read(within)
        results = {}
        threads = [threading.Thread(target=act_until_goodbye, args=(learner.endpoint, i, send_every, results))
                   for i in range(actors)]
        for thread in threads:
            thread.start()
        assert learner.wait(lambda service: len(service.server.sessions) == actors)
        while any(thread.is_alive() for thread in threads):
            try:  # busy for a while, again and again: meanwhile the actors send all they hold
                learner.read(lambda service: threading.Event().wait(0.2), timeout_s=2)
            except TimeoutError:  # the service has ended
                break
        for thread in threads:
            thread.join(60)
        counters = learner.service.counters
    assert all(bye is not None for _, bye in results.values()), results  # ended by the learner's goodbye
    assert budget <= counters.env_steps <= budget + actors * send_every
    episodes_ended = counters.rows - counters.env_steps  # a final row each
    assert sum(granted) <= budget + actors * send_every + episodes_ended


def test_the_goodbye_says_plainly_whether_untaken_rows_are_kept_or_dropped():
    from embodyrl.cli.processes import goodbye_note

    class Held:  # what the note reads of a spool
        rows = 2624

        def __len__(self):
            return 41

    kept = goodbye_note("budget reached", Held(), "/data/spool")
    assert "2624 rows in 41 batches" in kept and "/data/spool" in kept and "nothing is lost" in kept
    dropped = goodbye_note("budget reached", Held(), None)
    assert "are dropped" in dropped and "actor.spool_dir" in dropped and "unacknowledged" not in dropped
