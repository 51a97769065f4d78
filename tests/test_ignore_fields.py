"""Observation fields no network reads (``encoder.ignore_fields``): a camera only the reward looks at.

The pixel pendulum at 32x32 observes ``angular_velocity`` and ``orientation`` beside
``camera/front``; with the camera ignored the networks, their update and the numpy export read
the state fields alone, while the device still sends the camera and the replay still stores it.
"""

import json

import jax
import numpy as np
import pytest

from embodyrl.algos import registry
from embodyrl.algos.ddpg import DDPGConfig
from embodyrl.algos.encoders import EncoderConfig, check_images
from embodyrl.algos.heads import over
from embodyrl.algos.sac import SACConfig
from embodyrl.hal import runtime
from embodyrl.hal.layout import DeviceKind, Layout
from embodyrl.hal.specs import ArraySpec, DictSpec
from embodyrl.hal.steps import Steps
from embodyrl.replay import PersistentReplay

CAMERA = "camera/front"
STATE_SIZE = 3  # angular_velocity (1) + orientation (2)
IGNORE = EncoderConfig(ignore_fields=(CAMERA,))
K, B = 2, 8


def _algorithm(name: str, encoder: EncoderConfig = IGNORE):
    section = SACConfig(hidden_sizes=(16,), batch_size=B, encoder=encoder) if name in ("sac", "rlpd") \
        else DDPGConfig(hidden_sizes=(16,), batch_size=B, encoder=encoder)
    return registry.build(name, section)


@pytest.fixture(scope="module")
def device():
    """(observation spec, action spec, a real first observation) of the 32x32 pixel pendulum."""
    from embodyrl.envs.pixels import PixelsConfig, make_device

    made = make_device(PixelsConfig(width=32, height=32))
    with made:
        observation = made.reset(seed=0)
    assert made.observation_spec[CAMERA].shape == (32, 32, 3)
    return made.observation_spec, made.action_spec, observation


def _other_camera(observation: dict) -> dict:
    """The same observation with every camera pixel changed."""
    return {**observation, CAMERA: (255 - observation[CAMERA]).astype(np.uint8)}


def _batched(observation: dict) -> dict:
    return jax.tree.map(lambda x: np.asarray(x)[None], observation)


def _replay_batches(tmp_path, observation_spec, action_spec) -> dict:
    """K batches sampled from a real replay that stores the camera with every row."""
    n = 24
    rng = np.random.default_rng(0)
    final = (np.arange(n) % 12) == 11
    observation = {CAMERA: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                   "angular_velocity": rng.normal(size=(n, 1)).astype(np.float32),
                   "orientation": rng.normal(size=(n, 2)).astype(np.float32)}
    action = rng.uniform(-1, 1, (n, *action_spec.shape)).astype(np.float32)
    steps = Steps(observation=observation, action=action, proposed_action=action,
                  log_prob=np.zeros(n, np.float32), reward=rng.normal(size=n).astype(np.float32),
                  terminated=np.zeros(n, bool), truncated=final, final=final,
                  episode_id=np.arange(n) // 12, step_index=(np.arange(n) % 12).astype(np.int32),
                  device_id=np.zeros(n, np.int32), actor_id=np.zeros(n, np.int32),
                  policy_incarnation=np.ones(n, np.int64), policy_count=np.zeros(n, np.int64),
                  source=np.zeros(n, np.uint8))
    replay = PersistentReplay(tmp_path / "replay", observation_spec, action_spec, capacity=64, chunk_rows=32)
    replay.add(steps)
    replay.commit()
    samples = [replay.sample(np.random.default_rng(k), B, discount=0.99) for k in range(K)]
    return jax.tree.map(lambda *xs: np.stack(xs), *samples)


@pytest.mark.parametrize("name", ["sac", "rlpd", "ddpg"])
def test_the_networks_read_the_state_fields_and_train_on_batches_that_carry_the_camera(tmp_path, device, name):
    observation_spec, action_spec, observation = device
    algorithm = _algorithm(name)
    networks, state = algorithm.init(jax.random.key(0), observation_spec, action_spec)
    assert networks.encoder is None and list(networks.inputs) == ["angular_velocity", "orientation"]
    assert networks.observation_spec == observation_spec  # what the device sends is unchanged
    actor = algorithm.actor_params(state)
    assert actor["layers"][0]["kernel"].shape[0] == STATE_SIZE
    critic_in = state.critic_params["layers"][0]["kernel"].shape[1]  # [critics, in, out]
    assert critic_in == STATE_SIZE + action_spec.size

    batches = _replay_batches(tmp_path, observation_spec, action_spec)
    assert batches["observation"][CAMERA].shape == (K, B, 32, 32, 3)  # the replay keeps the camera
    lowered = jax.jit(algorithm.make_update_many(networks)).lower(state, batches)
    assert "ui8" not in lowered.as_text()  # the unread camera is not an input of the compiled update
    new, metrics = lowered.compile()(state, batches)
    assert all(np.isfinite(np.asarray(v)).all() for v in metrics.values())
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                         new.critic_params, state.critic_params)
    assert max(jax.tree.leaves(moved)) > 0

    actor = algorithm.actor_params(new)
    seen, changed = _batched(observation), _batched(_other_camera(observation))
    np.testing.assert_array_equal(algorithm.mean_action(networks, actor, seen),
                                  algorithm.mean_action(networks, actor, changed))
    key = jax.random.key(3)  # exploring too: the same draw gives the same action
    np.testing.assert_array_equal(algorithm.act(networks, actor, seen, key, True)[0],
                                  algorithm.act(networks, actor, changed, key, True)[0])


@pytest.mark.parametrize("name", ["sac", "ddpg"])
def test_the_numpy_export_never_names_the_camera_and_acts_as_jax(tmp_path, device, name):
    observation_spec, action_spec, observation = device
    algorithm = _algorithm(name)
    networks, actor = algorithm.actor_networks(observation_spec, action_spec, jax.random.key(1))
    graph, arrays = algorithm.export(networks, actor, (1, 0))
    assert CAMERA not in json.dumps(graph["graph"])
    assert graph["graph"][0] == {"op": "concat", "fields": ["angular_velocity", "orientation"]}
    assert DictSpec.from_msg(graph["observation_spec"]) == observation_spec  # a device check still passes
    runtime.save(tmp_path / "policy", graph, arrays)
    policy = runtime.load(tmp_path / "policy")
    jax_action = np.asarray(algorithm.mean_action(networks, actor, _batched(observation)))[0]
    np.testing.assert_allclose(policy.mean_action(observation), jax_action, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(policy.mean_action(_other_camera(observation)), policy.mean_action(observation))
    policy.load_weights((1, 1), arrays)  # the learner's published weights fit the graph


def test_a_read_camera_and_an_ignored_one():
    """``image_fields: [auto]`` takes every camera but the ignored ones; the export's image op names only those."""
    spec = DictSpec.of(ArraySpec("camera/front", (16, 16, 3), np.uint8, 0, 255),
                       ArraySpec("camera/top", (40, 40, 3), np.uint8, 0, 255),
                       ArraySpec("orientation", (2,), np.float32))
    action_spec = ArraySpec("action", (1,), np.float32, -2.0, 2.0)
    encoder = EncoderConfig(image_fields=("auto",), ignore_fields=("camera/top",), channels=(4,), strides=(2,),
                            feature_dim=4, augment_pad=0)
    algorithm = _algorithm("sac", encoder)
    networks, actor = algorithm.actor_networks(spec, action_spec, jax.random.key(0))
    assert networks.encoder.image_fields == ("camera/front",)
    assert networks.encoder.state_fields == ("orientation",)
    graph, arrays = algorithm.export(networks, actor, (1, 0))
    assert "camera/top" not in json.dumps(graph["graph"])
    assert graph["graph"][0] == {"op": "image", "fields": ["camera/front"]}
    rng = np.random.default_rng(0)
    observation = {name: rng.integers(0, 256, s.shape, dtype=np.uint8) if s.dtype == np.uint8
                   else rng.normal(size=s.shape).astype(np.float32) for name, s in spec.items()}
    jax_action = np.asarray(algorithm.mean_action(networks, actor, _batched(observation)))[0]
    np.testing.assert_allclose(runtime.NumpyPolicy(graph, arrays).mean_action(observation), jax_action,
                               rtol=1e-4, atol=1e-5)


def test_bad_ignore_fields_are_refused_naming_the_field_and_the_section(device):
    observation_spec, action_spec, _ = device
    fields = r"fields: \['angular_velocity', 'camera/front', 'orientation'\]"
    with pytest.raises(ValueError, match=rf"sac\.encoder\.ignore_fields: 'camera/top' is not an observation field; {fields}"):
        _algorithm("sac", EncoderConfig(ignore_fields=("camera/top",))).init(
            jax.random.key(0), observation_spec, action_spec)
    with pytest.raises(ValueError, match=r"ddpg\.encoder\.ignore_fields: 'camera/top'"):
        _algorithm("td3", EncoderConfig(ignore_fields=("camera/top",))).actor_networks(
            observation_spec, action_spec, jax.random.key(0))
    with pytest.raises(ValueError, match="sac.encoder: 'camera/front' is in both image_fields and ignore_fields"):
        _algorithm("sac", EncoderConfig(image_fields=(CAMERA,), ignore_fields=(CAMERA,))).init(
            jax.random.key(0), observation_spec, action_spec)
    with pytest.raises(ValueError, match="every observation field is ignored"):
        check_images(observation_spec, EncoderConfig(ignore_fields=tuple(observation_spec)), "sac.encoder")


def test_an_ignored_camera_is_not_taken_for_one_flattened_into_the_mlp():
    camera = DictSpec.of(ArraySpec(CAMERA, (84, 84, 3), np.uint8, 0, 255), ArraySpec("orientation", (2,), np.float32))
    with pytest.raises(ValueError, match="is a camera image"):
        check_images(camera, EncoderConfig(), "sac.encoder")
    check_images(camera, IGNORE, "sac.encoder")  # not read: nothing to refuse


def test_several_device_kinds_refuse_ignore_fields():
    act = ArraySpec("action", (1,), np.float32, -1.0, 1.0)
    layout = Layout((DeviceKind("a", DictSpec.of(ArraySpec("x", (2,), np.float32)), act),
                     DeviceKind("b", DictSpec.of(ArraySpec("y", (3,), np.float32)), act)))
    with pytest.raises(ValueError, match="sac.encoder.ignore_fields must be empty"):
        over(_algorithm("sac", EncoderConfig(ignore_fields=("x",))), layout)


def test_the_cli_refuses_a_bad_name_before_the_run_starts(tmp_path):
    from tests.cli_helpers import in_process

    run = tmp_path / "run"
    proc = in_process("train", "pendulum_pixels", "--sac.encoder.ignore_fields", "[camera/top]", "--steps", "10",
                      "--run-dir", str(run))
    assert proc.returncode == 2, proc.stderr
    assert "sac.encoder.ignore_fields: 'camera/top' is not an observation field" in proc.stderr
    assert not run.exists()
