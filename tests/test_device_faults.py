"""A device that fails (a driver's fault, an observation off its spec) stops its actor with one line naming
the cause and exit code 1; ``embodyrl --debug`` shows the traceback instead."""

import dataclasses
import os

import pytest

from embodyrl import robot as robots
from embodyrl.cli import processes
from embodyrl.config import TrainConfig, default_config, from_dict, to_dict
from embodyrl.hal.specs import SpecError
from embodyrl.learner.testing import ServedLearner
from tests.cli_helpers import in_process

TASK = "robot_helpers:point_mass_off_its_spec"


@pytest.fixture
def run(tmp_path):
    """(config, endpoint): an actor's config for the faulty robot and a learner serving its layout."""
    data = to_dict(default_config(TASK))
    data["actor"].update({"random_steps": 10})
    with ServedLearner(tmp_path, robots.load(TASK).layout(), run_id="faults", incarnation=3) as learner:
        yield dataclasses.asdict(from_dict(TrainConfig, data)), learner.endpoint


def test_a_device_off_its_spec_stops_the_actor_with_one_line_and_exit_1(run, monkeypatch, capsys):
    monkeypatch.delenv(processes.DEBUG_ENV, raising=False)
    with pytest.raises(SystemExit) as stopped:
        processes.actor_main(*run, 0, max_steps=50)
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert ("embodyrl: actor 0: the device failed: SpecError: position: dtype float64 where float32 was "
            "expected (embodyrl --debug COMMAND ... shows the traceback)") in err
    assert "Traceback" not in err


def test_with_debug_the_fault_raises_with_its_traceback(run, monkeypatch):
    monkeypatch.setenv(processes.DEBUG_ENV, "1")
    with pytest.raises(SpecError, match="position: dtype float64 where float32 was expected"):
        processes.actor_main(*run, 0, max_steps=50)


def test_the_debug_flag_reaches_the_processes_a_command_starts(monkeypatch):
    monkeypatch.setenv(processes.DEBUG_ENV, "0")  # restored (removed) after the test
    assert in_process("--debug", "tasks").returncode == 0
    assert os.environ[processes.DEBUG_ENV] == "1"
