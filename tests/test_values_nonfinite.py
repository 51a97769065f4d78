"""A finite but absurd batch (reward 3e38) makes a loss infinite: that update is skipped, the state
kept whole, and the skip counted, in every algorithm's jitted update and in the learner's records."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import ddpg, dqn, ppo, sac
from embodyrl.algos.registry import as_algorithm
from embodyrl.hal.specs import ArraySpec, DictSpec

OBS = DictSpec.of(ArraySpec("x", (3,), np.float32))
CONTINUOUS = ArraySpec("action", (2,), np.float32, -1.0, 1.0)
DISCRETE = ArraySpec("action", (), np.int32, 0, 3)
HUGE = 3e38
N = 8
CASES = {
    "ddpg": (ddpg.DDPGConfig(hidden_sizes=(16,), batch_size=N), CONTINUOUS),
    "sac": (sac.SACConfig(hidden_sizes=(16,), batch_size=N), CONTINUOUS),
    "dqn": (dqn.DQNConfig(hidden_sizes=(16,), batch_size=N), DISCRETE),
}


def _batches(action_spec, rewards) -> dict:
    """K replay batches stacked ``[K, N, ...]``, batch k paying ``rewards[k]`` on every row."""
    k = len(rewards)
    rng = np.random.default_rng(0)
    if action_spec.dtype.kind in "iu":
        action = rng.integers(0, 4, (k, N)).astype(np.int32)
    else:
        action = rng.uniform(-1, 1, (k, N, 2)).astype(np.float32)
    return {"observation": {"x": rng.standard_normal((k, N, 3)).astype(np.float32)}, "action": action,
            "reward": np.repeat(np.asarray(rewards, np.float32)[:, None], N, 1),
            "discount": np.full((k, N), 0.9, np.float32),
            "next_observation": {"x": rng.standard_normal((k, N, 3)).astype(np.float32)}}


def _leaves(state) -> list[np.ndarray]:
    """The state's leaves as numpy arrays (typed PRNG keys as their key data)."""
    def plain(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.array(x)  # a copy: the learner's update donates the state's buffers
    return [plain(x) for x in jax.tree.leaves(state)]


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b), strict=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_update_with_an_infinite_loss_keeps_the_state_and_counts_one_skip(name):
    config, action_spec = CASES[name]
    algorithm = as_algorithm(config)
    networks, state = algorithm.init(jax.random.key(0), OBS, action_spec)
    update = jax.jit(algorithm.make_update_many(networks))

    kept, metrics = update(state, _batches(action_spec, [HUGE]))
    assert _same(kept, state)
    assert float(metrics["nonfinite_skipped"]) == 1.0

    # K = 2: the good step is taken, the absurd one skipped; the metrics are the good step's
    one, alone = update(state, _batches(action_spec, [1.0]))
    both, mixed = update(state, {k: jax.tree.map(lambda a, b: np.concatenate([a, b]), v, w)
                                 for (k, v), w in zip(_batches(action_spec, [1.0]).items(),
                                                      _batches(action_spec, [HUGE]).values(), strict=True)})
    assert float(alone["nonfinite_skipped"]) == 0.0 and float(mixed["nonfinite_skipped"]) == 1.0
    assert not _same(one, state) and _same(both, one)
    loss = next(k for k in mixed if k.endswith("loss"))
    assert np.isfinite(float(mixed[loss])) and float(mixed[loss]) == pytest.approx(float(alone[loss]))


def test_a_ppo_iteration_with_an_infinite_loss_keeps_the_whole_state():
    config = ppo.PPOConfig(hidden_sizes=(16,), epochs=1, minibatches=2)
    networks, state = ppo.init(jax.random.key(0), OBS, CONTINUOUS, config)
    T, B = 8, 2
    obs = {"x": jax.random.normal(jax.random.key(1), (T, B, 3))}
    action, extras = ppo.act(networks, config, state.params, obs, jax.random.key(2))
    batch = {"observation": obs, "action": action, "reward": jnp.full((T, B), HUGE), "discount": jnp.zeros((T, B)),
             "behaviour_log_prob": extras["log_prob"], "bootstrap_observation": {"x": jnp.zeros((B, 3))}}
    kept, metrics = jax.jit(ppo.make_update(networks, config))(state, batch)
    assert float(metrics["nonfinite_skipped"]) == 1.0
    assert _same(kept, state)  # the key and the iteration count too


class _OneBatch:
    """A data side that always has one training call's batch: the absurd one."""

    def __init__(self, batch):
        self._batch = batch

    def trainable(self):
        return True

    def batch(self):
        return self._batch, {}

    def trained(self, updates):
        pass

    def published(self, version):
        return 0

    def metrics(self):
        return {}


def test_the_learner_counts_skipped_updates_in_its_records_and_its_status():
    from embodyrl.learner.service import LearnerService, Training
    from embodyrl.transport import LearnerServer

    config, action_spec = CASES["ddpg"]
    training = Training.of(as_algorithm(config), OBS, action_spec, 0, updates_per_call=1, publish_every=1)
    server = LearnerServer(run_id="skip", incarnation=3)
    try:
        service = LearnerService(server, _OneBatch(_batches(action_spec, [HUGE])), training, incarnation=3)
        before = _leaves(training.state)
        assert service.train()
        assert all(np.array_equal(a, b) for a, b in zip(before, _leaves(training.state), strict=True))
        record = service.log()  # read back from the device here, not in the training call
        assert record["nonfinite_updates_skipped"] == 1 and service.counters.nonfinite_updates_skipped == 1
        assert service.console_status()["nonfinite_updates_skipped"] == 1
        assert service.train() and service.console_status()["nonfinite_updates_skipped"] == 2
    finally:
        server.close()
