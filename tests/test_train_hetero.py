"""``embodyrl train a+b``: one SAC policy over the pendulum and the 7-DoF arm, trained end to end in
subprocesses; eval, export, plot and the refusals through the command's ``main`` in this process."""

import json

import numpy as np
import pytest

from embodyrl.config import load
from embodyrl.hal import runtime
from embodyrl.hal.steps import PolicyVersion
from tests.cli_helpers import cli_in_session, in_process

TASK = "pendulum+arm_reach"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("hetero") / "run"
    code, _, err, _ = cli_in_session("train", TASK, "--algorithm", "sac", "--steps", "800", "--eval_episodes", "1",
                                     "--sac.hidden_sizes", "[32, 32]", "--learner.min_replay", "300",
                                     "--actor.random_steps", "200", "--run-dir", str(run), "--quiet", timeout=400)
    assert code == 0, err[-3000:]
    return run


def test_both_devices_stream_into_one_replay_and_are_evaluated_apart(run_dir):
    from embodyrl.replay import PersistentReplay
    from tests.replay_helpers import stored_slots

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 800 and set(summary["devices"]) == {"pendulum", "arm_reach"}
    assert "eval_upright_fraction" in summary["devices"]["pendulum"]  # each task's own metrics
    assert "eval_final_distance" in summary["devices"]["arm_reach"]
    replay = PersistentReplay(run_dir / "replay")
    rows = replay.store.rows[stored_slots(replay)]
    devices = rows["observation/device"]
    assert set(np.unique(devices).tolist()) == {0, 1}
    np.testing.assert_array_equal(rows[devices == 0]["action"][:, 1:], 0.0)  # the pendulum's one torque
    replay.close()
    proc = in_process("eval", str(run_dir), "--episodes", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for name, figures in summary["devices"].items():  # the same seeded episode, the same policy
        assert result["devices"][name]["returns"] == pytest.approx(figures["eval_returns"], rel=1e-5)


def test_each_device_exports_its_own_numpy_policy(run_dir, tmp_path):
    from embodyrl import envs
    from embodyrl.policy import JaxPolicy

    config = load(run_dir / "config.json")
    layout = envs.layout(config.task)
    with np.load(run_dir / "policy" / "weights.npz") as data:
        weights = {k: data[k] for k in data.files}
    for device_id, name in enumerate(("pendulum", "arm_reach")):
        proc = in_process("export", str(run_dir), str(tmp_path / name), "--device", name)
        assert proc.returncode == 0, proc.stderr
        numpy_policy = runtime.load(tmp_path / name)
        policy = JaxPolicy(config.algo, layout, device_id)
        policy.load_weights(PolicyVersion(0, 0), weights)
        kind = layout.kinds[device_id]
        assert numpy_policy.action_spec == kind.action_spec
        rng = np.random.default_rng(device_id)
        for _ in range(5):
            obs = {s.name: rng.normal(size=s.shape).astype(np.float32) for s in kind.observation_spec.specs}
            np.testing.assert_allclose(numpy_policy.mean_action(obs), policy.act(obs, explore=False)[0],
                                       rtol=1e-4, atol=1e-5)
    missing = in_process("export", str(run_dir), str(tmp_path / "x"))
    assert missing.returncode == 2 and "name one of pendulum, arm_reach" in missing.stderr


@pytest.mark.parametrize("args,reason", [
    (("pendulum+pendulum",), "names device kind 'pendulum' twice"),
    (("pendulum+",), "is empty"),
    ((TASK, "--algorithm", "ppo"), "off-policy"),
    ((TASK, "--algorithm", "sac", "--sac.encoder.image_fields", "[auto]"), "image_fields must be empty"),
    (("pendulum_pixels+pendulum",), "observes an image ('camera/front'"),
])
def test_what_one_layout_cannot_hold_is_refused_before_the_run_starts(tmp_path, args, reason):
    run = tmp_path / "run"
    proc = in_process("train", *args, "--steps", "10", "--run-dir", str(run))
    assert proc.returncode == 2 and reason in proc.stderr, proc.stderr
    assert not (run / "config.json").exists()  # nothing written: a corrected retry needs no --resume


def test_metrics_and_plot_give_each_device_its_own_curve(run_dir, tmp_path):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for device in ("pendulum", "arm_reach"):
        values = [r[f"episode_return/{device}"] for r in lines if r[f"episode_return/{device}"] is not None]
        assert values and all(np.isfinite(values))
    pendulum = [r["episode_return/pendulum"] for r in lines if r["episode_return/pendulum"] is not None]
    assert max(pendulum) <= 0 and min(pendulum) > -200 * 16.3  # the pendulum's reward range: its own episodes
    proc = in_process("plot", str(run_dir), "--out", str(tmp_path / "curves.png"))
    assert proc.returncode == 0, proc.stderr
    drawn = json.loads(proc.stdout)["groups"]
    assert sorted(drawn) == ["pendulum+arm_reach sac · arm_reach", "pendulum+arm_reach sac · pendulum"]
    assert (tmp_path / "curves.png").stat().st_size > 0
