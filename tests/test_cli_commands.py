"""``embodyrl eval``, ``replay``, ``plot`` and the TensorBoard log, on one tiny run trained in a subprocess
(the commands that start no other process run in this one)."""

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from embodyrl.config import default_config, save
from tests.cli_helpers import cli as _cli
from tests.cli_helpers import cli_in_session, in_process


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real ``embodyrl train`` run from a YAML file plus overrides: 600 steps, small networks."""
    root = tmp_path_factory.mktemp("cli")
    config = root / "tiny.yaml"
    config.write_text("# tiny pendulum run\nsteps: 600\neval_episodes: 2\nsac:\n  hidden_sizes: [32, 32]\n"
                      "learner:\n  min_replay: 200\n  log_every_s: 0.5\nactor:\n  random_steps: 300\n")
    run = root / "run"
    code, _, err, _ = cli_in_session("train", "pendulum", "--config", str(config), "--sac.actor_lr", "1e-3",
                                     "--learner.updates_per_step=0.5", "--seed", "3", "--run-dir", str(run),
                                     "--quiet")
    assert code == 0, err
    return run


def test_config_file_and_overrides_reach_the_run(run_dir):
    config = json.loads((run_dir / "config.json").read_text())
    assert config["steps"] == 600 and config["seed"] == 3 and config["eval_episodes"] == 2
    assert config["sac"]["hidden_sizes"] == [32, 32] and config["sac"]["actor_lr"] == 1e-3
    assert config["learner"]["updates_per_step"] == 0.5 and config["learner"]["min_replay"] == 200
    assert config["algorithm"] == "sac"  # pendulum's tuned default, untouched by the file
    assert (run_dir / "config.yaml").read_text().startswith("# tiny pendulum run\n")  # verbatim


def _events(directory: Path) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in the TFRecord event files of ``directory``."""
    from tensorboardX.proto import event_pb2

    found = []
    files = sorted(directory.glob("events.out.tfevents.*"))
    assert files, f"no event file in {directory}"
    for path in files:
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            record = data[at + 12:at + 12 + length]  # after the length and its CRC
            at += 12 + length + 4
            event = event_pb2.Event()
            event.ParseFromString(record)
            found.extend((v.tag, event.step, v.simple_value) for v in event.summary.value)
    return found


def test_tensorboard_holds_the_same_scalars_as_metrics_jsonl(run_dir):
    events = _events(run_dir / "tb")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = lines[-1]
    by_tag_step = {(tag, step): value for tag, step, value in events}
    numeric = [k for k, v in last.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert {"env_steps", "updates", "replay_size", "policy_version"} <= set(numeric)
    for key in numeric:
        assert by_tag_step[(key, last["env_steps"])] == pytest.approx(last[key], rel=1e-6, abs=1e-6)
    returns = [(line["env_steps"], line["episode_return"]) for line in lines if line["episode_return"] is not None]
    assert returns, "no episode finished in the run"
    tb_returns = sorted((s, v) for t, s, v in events if t == "episode_return")
    assert len(tb_returns) == len(returns)
    assert np.allclose([v for _, v in tb_returns], [r for _, r in sorted(returns)], rtol=1e-6)
    assert not any(t in ("rejected_by_reason", "weights_sent") for t, _, _ in events)  # dicts stay in JSONL


def test_eval_reproduces_the_training_evaluation_and_renders_a_strip(run_dir, tmp_path):
    strip = tmp_path / "strip.png"
    # a subprocess: MuJoCo takes its GL backend (MUJOCO_GL) once, when first imported in a process
    proc = _cli("eval", str(run_dir), "--episodes", "2", "--strip", str(strip), "--frames", "5",
                "--width", "64", "--height", "48")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    summary = json.loads((run_dir / "summary.json").read_text())
    # the same seeded episodes as train's own evaluation, the same deterministic policy
    assert result["returns"] == pytest.approx(summary["eval_returns"], rel=1e-5)
    assert result["upright_fraction_mean"] == pytest.approx(summary["eval_upright_fraction"])
    assert result["task"] == "pendulum" and result["episodes"] == 2
    assert result["strip_return"] == pytest.approx(summary["eval_returns"][0], rel=1e-5)
    import matplotlib.image

    image = matplotlib.image.imread(strip)
    assert image.shape[:2] == (48, 5 * 64) and result["frames"] == 5
    frames = np.split(image[..., :3], 5, axis=1)
    assert all(f.std() > 0.01 for f in frames)  # rendered scenes, not blank
    assert any(np.abs(a - b).mean() > 1e-3 for a, b in zip(frames, frames[1:], strict=False))  # it moves


def test_eval_of_a_directory_without_a_run_is_exit_2(tmp_path):
    proc = in_process("eval", str(tmp_path))
    assert proc.returncode == 2 and "config.json" in proc.stderr


def test_replay_reports_what_the_run_stored(run_dir):
    proc = in_process("replay", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    final = json.loads(lines[-1])
    assert report["size"] == final["replay_size"] and report["size"] >= 600
    assert report["rows_by_source"] == {"online": report["size"]}
    assert report["rows_by_actor"] == {"0": report["size"]}
    assert set(report["committed_seqs"]) == {"0"} and report["committed_seqs"]["0"] > 0
    assert report["capacity"] >= report["size"] and report["chunks_used"] >= 1
    assert sum(report["rows_by_policy_version"].values()) == report["size"]
    assert report["policy_count_min"] == -1  # the 300 random warm-up steps carry no policy
    assert report["policy_count_max"] >= 1  # later steps came from published weights
    assert report["episodes_complete"] == final["episodes"]
    text = in_process("replay", str(run_dir / "replay"))
    assert text.returncode == 0 and "size" in text.stdout and str(report["size"]) in text.stdout


def test_replay_of_a_directory_without_one_is_exit_2(tmp_path):
    proc = in_process("replay", str(tmp_path))
    assert proc.returncode == 2 and "no replay" in proc.stderr


def _fake_run(path: Path, seed: int, lr: float, returns: list[float], unread_discount: float = 0.99) -> Path:
    """A run directory with a real config.json (the pendulum's SAC at actor learning rate ``lr``; the
    DDPG section it does not read at ``unread_discount``) and a metrics.jsonl of known returns."""
    import dataclasses

    config = default_config("pendulum")
    config = dataclasses.replace(config, seed=seed, sac=dataclasses.replace(config.sac, actor_lr=lr),
                                 ddpg=dataclasses.replace(config.ddpg, discount=unread_discount))
    path.mkdir()
    save(config, path / "config.json")
    with (path / "metrics.jsonl").open("w") as f:
        for i, r in enumerate(returns):
            f.write(json.dumps({"env_steps": 100 * (i + 1), "episode_return": r, "updates": i}) + "\n")
        f.write(json.dumps({"env_steps": 100 * (len(returns) + 1), "episode_return": None}) + "\n")
    return path


def test_plot_groups_seeds_and_writes_a_png(tmp_path, run_dir):
    runs = [_fake_run(tmp_path / "a0", 0, 3e-4, [-900, -500, -100]),
            _fake_run(tmp_path / "a1", 1, 3e-4, [-700, -300, -300], unread_discount=0.5),  # not a difference
            _fake_run(tmp_path / "b0", 0, 1e-3, [-1000, -1000, -1000])]
    out = tmp_path / "curves.png"
    proc = in_process("plot", *map(str, runs), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    groups = json.loads(proc.stdout)["groups"]
    assert set(groups) == {"sac.actor_lr=0.0003", "sac.actor_lr=0.001"}
    assert len(groups["sac.actor_lr=0.0003"]["runs"]) == 2
    assert groups["sac.actor_lr=0.0003"]["final_mean"] == pytest.approx(-200)
    assert groups["sac.actor_lr=0.001"]["final_mean"] == pytest.approx(-1000)
    import matplotlib.image

    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.01  # something was drawn
    real = in_process("plot", str(run_dir), "--out", str(tmp_path / "real.png"), "--metric", "updates")
    assert real.returncode == 0, real.stderr
    assert matplotlib.image.imread(tmp_path / "real.png").shape[0] > 100


def test_a_run_level_difference_names_the_groups_without_the_sections_it_sets(tmp_path):
    import dataclasses

    from embodyrl.cli.plot import group_runs
    from embodyrl.learner.synchronous import synchronous_config

    config = default_config("pendulum")
    for name, run_config in (("async", config), ("sync", synchronous_config(config))):
        (tmp_path / name).mkdir()
        save(dataclasses.replace(run_config, seed=1), tmp_path / name / "config.json")
    assert set(group_runs([tmp_path / "async", tmp_path / "sync"])) == {"synchronous=false", "synchronous=true"}


def test_plot_names_a_missing_metric_and_a_non_run(tmp_path):
    run = _fake_run(tmp_path / "a", 0, 3e-4, [-1.0])
    proc = in_process("plot", str(run), "--metric", "nosuch", "--out", str(tmp_path / "x.png"))
    assert proc.returncode == 2 and "nosuch" in proc.stderr and "episode_return" in proc.stderr
    proc = in_process("plot", str(tmp_path), "--out", str(tmp_path / "x.png"))
    assert proc.returncode == 2 and "config.json" in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_plot_keeps_each_runs_artifacts_beside_the_png_and_redraws_from_them(tmp_path, run_dir):
    from embodyrl.runlog import COMPRESS_ABOVE_BYTES, has_artifacts, kept_runs, learner_records

    big = _fake_run(tmp_path / "long", 1, 3e-4, [-float(i) for i in range(COMPRESS_ABOVE_BYTES // 40)])
    (big / "summary.json").write_text(json.dumps({"eval_return_mean": -1.0}))
    out = tmp_path / "docs" / "fig.png"
    proc = in_process("plot", str(run_dir), str(big), "--out", str(out), "--keep-artifacts")
    assert proc.returncode == 0, proc.stderr
    kept = tmp_path / "docs" / "fig"  # runs named by their paths below their common parent
    common = Path(os.path.commonpath([run_dir.parent, big.parent]))
    names = {r: str(r.relative_to(common)) for r in (run_dir, big)}
    assert sorted(json.loads(proc.stdout)["artifacts"]) == sorted(str(kept / n) for n in names.values())
    kept_run, kept_long = kept / names[run_dir], kept / names[big]
    assert has_artifacts(kept_run) and has_artifacts(kept_long) and kept_runs(kept) == sorted([kept_run, kept_long])
    assert (kept_run / "metrics.jsonl").exists() and not (kept_run / "replay").exists()
    assert (kept_long / "metrics.jsonl.gz").exists()  # large: compressed, and still readable
    assert learner_records(kept_long) == learner_records(big)
    assert (kept_run / "summary.json").read_text() == (run_dir / "summary.json").read_text()
    again = in_process("plot", str(kept_run), str(kept_long), "--out", str(out), "--keep-artifacts")
    assert again.returncode == 0, again.stderr  # redrawn from the kept artifacts alone
    finals = {name: group["final_mean"] for name, group in json.loads(proc.stdout)["groups"].items()}
    assert {name: group["final_mean"] for name, group in json.loads(again.stdout)["groups"].items()} == finals
    assert sorted(json.loads(again.stdout)["artifacts"]) == sorted([str(kept_run), str(kept_long)])


def test_plot_refuses_to_keep_a_run_without_its_summary(tmp_path):
    run = _fake_run(tmp_path / "unfinished", 0, 3e-4, [-1.0, -2.0])
    proc = in_process("plot", str(run), "--out", str(tmp_path / "x.png"), "--keep-artifacts")
    assert proc.returncode == 2 and "summary.json" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_export_writes_a_numpy_policy_that_acts_as_the_trained_one(run_dir, tmp_path):
    from embodyrl import envs
    from embodyrl.config import load
    from embodyrl.hal import runtime
    from embodyrl.policy import load_policy

    proc = in_process("export", str(run_dir), str(tmp_path / "pendulum"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["graph"] == str(tmp_path / "pendulum.json")
    numpy_policy = runtime.load(tmp_path / "pendulum")
    config = load(run_dir / "config.json")
    policy = load_policy(run_dir / "policy", config.algo)
    assert tuple(numpy_policy.version) == tuple(policy.version)
    device, _ = envs.make("pendulum")
    with device:
        observation = device.reset(seed=1)
        for _ in range(20):
            action, _ = policy.act(observation, explore=False)
            np.testing.assert_allclose(numpy_policy.mean_action(observation), action, rtol=1e-4, atol=1e-5)
            observation = device.step(action)
    wrong = in_process("export", str(run_dir), str(tmp_path / "x"), "--device", "arm_reach")
    assert wrong.returncode == 2 and "has one device" in wrong.stderr
