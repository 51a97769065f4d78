"""CurveZMQ options of ``embodyrl learner``, ``actor`` and ``train``: refusals name the option; keys work."""

import json
import os
import signal
import subprocess
import sys

import pytest

from embodyrl.cli.commands import main
from embodyrl.hal.wire.security import generate_keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys")
    generate_keys(directory / "learner", "learner")
    generate_keys(directory / "actors", "robot")
    (directory / "tiny.yaml").write_text("steps: 100\nlearner: {min_replay: 50}\nactor: {random_steps: 50}\n")
    return directory


REFUSED = [
    (["learner", "pendulum", "--bind", "tcp://0.0.0.0:5599"], "--bind: refusing plain TCP"),
    (["learner", "pendulum", "--secret-key", "{k}/learner/learner.key_secret"], "--secret-key needs --authorized-keys"),
    (["learner", "pendulum", "--authorized-keys", "{k}/actors"], "--authorized-keys needs --secret-key"),
    (["learner", "pendulum", "--secret-key", "{k}/learner/learner.key", "--authorized-keys", "{k}/actors"],
     "holds no secret key"),
    (["learner", "pendulum", "--secret-key", "{k}/nothing.key_secret", "--authorized-keys", "{k}/actors"],
     "--secret-key: key file"),
    (["learner", "pendulum", "--secret-key", "{k}/learner/learner.key_secret", "--authorized-keys", "{k}/none"],
     "--authorized-keys: no directory"),
    (["learner", "pendulum", "--secret-key", "{k}/learner/learner.key_secret", "--authorized-keys", "{k}"],
     "holds no public .key file"),
    (["actor", "pendulum", "--connect", "tcp://10.1.2.3:5555"], "--connect: refusing plain TCP"),
    (["actor", "pendulum", "--connect", "tcp://10.1.2.3:5555", "--server-key", "{k}/learner/learner.key"],
     "--server-key needs --secret-key"),
    (["actor", "pendulum", "--connect", "tcp://127.0.0.1:9", "--secret-key", "{k}/actors/robot.key_secret",
      "--server-key", "{k}/learner/missing.key"], "--server-key: key file"),
    (["train", "pendulum", "--learner.bind", "tcp://0.0.0.0:0"], "--learner.bind: refusing plain TCP"),
    (["train", "pendulum", "--config", "{k}/tiny.yaml", "--learner.bind", "tcp://0.0.0.0:0"],
     "--learner.bind: refusing plain TCP"),  # and its YAML is not copied into a run directory
    (["learner", "pendulum", "--config", "{k}/tiny.yaml", "--bind", "tcp://10.0.0.1:5555"], "--bind: refusing"),
]


@pytest.mark.parametrize(("argv", "message"), REFUSED, ids=[" ".join(a[:1] + a[2:]) for a, _ in REFUSED])
def test_security_mistakes_exit_2_naming_the_option(argv, message, keys, tmp_path, capsys):
    argv = [a.replace("{k}", str(keys)) for a in argv]
    if argv[0] in ("learner", "train"):
        argv += ["--run-dir", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("embodyrl: ") and message in err, err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def _start(*args):
    return subprocess.Popen([sys.executable, "-m", "embodyrl.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_a_keyed_learner_and_actor_finish_a_run(keys, tmp_path):
    """The learner admits the actor whose public key is authorised; the run completes over CurveZMQ."""
    run_dir = tmp_path / "run"
    learner = _start("learner", "pendulum", "--run-dir", str(run_dir), "--steps", "400",
                     "--secret-key", str(keys / "learner" / "learner.key_secret"),
                     "--authorized-keys", str(keys / "actors"), "--sac.hidden_sizes", "[16, 16]",
                     "--learner.min_replay", "200", "--actor.random_steps", "200")
    actor = None
    try:
        line = learner.stdout.readline()
        assert line, learner.communicate(timeout=30)[1]
        endpoint = json.loads(line)["endpoint"]
        actor = _start("actor", "pendulum", "--connect", endpoint, "--config", str(run_dir / "config.json"),
                       "--secret-key", str(keys / "actors" / "robot.key_secret"),
                       "--server-key", str(keys / "learner" / "learner.key"))
        out, err = learner.communicate(timeout=240)
        assert learner.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["env_steps"] >= 400
        _, err = actor.communicate(timeout=60)
        assert actor.returncode == 0, err
    finally:
        for proc in (learner, actor):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
