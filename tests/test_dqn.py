"""Double DQN: targets against hand-worked cases, n-step returns, the replay, and learning a tiny task."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embodyrl.algos import dqn
from embodyrl.algos.dqn.replay import NStepReplay
from embodyrl.hal.specs import ArraySpec, DictSpec


def test_double_q_target_by_hand():
    # the online network picks action 1 (value 5); the target network values action 1 at 2, not its max 9
    y = dqn.double_q_targets(jnp.array([1.0]), jnp.array([0.5]), jnp.array([[3.0, 5.0, 4.0]]),
                             jnp.array([[9.0, 2.0, 0.0]]))
    assert float(y[0]) == pytest.approx(1.0 + 0.5 * 2.0)
    # a termination inside the n steps: no bootstrap at all
    y = dqn.double_q_targets(jnp.array([7.0]), jnp.array([0.0]), jnp.array([[3.0, 5.0]]), jnp.array([[9.0, 2.0]]))
    assert float(y[0]) == pytest.approx(7.0)


def test_vectorised_targets_equal_the_loop():
    rng = np.random.default_rng(0)
    r, d = rng.normal(size=32).astype(np.float32), rng.uniform(size=32).astype(np.float32)
    online, target = rng.normal(size=(32, 4)), rng.normal(size=(32, 4))
    np.testing.assert_allclose(dqn.double_q_targets(r, d, online, target),
                               dqn.double_q_targets_loop(r, d, online, target), rtol=1e-5, atol=1e-5)


def test_n_step_return_by_hand():
    R, D = dqn.n_step_return([1.0, 2.0, 4.0, 8.0], [False, False, True, False], gamma=0.5, n=2)
    np.testing.assert_allclose(R[:3], [1 + 0.5 * 2, 2 + 0.5 * 4, 4])
    np.testing.assert_allclose(D[:3], [0.25, 0.0, 0.0])  # the second and third reach the termination


def test_replay_emits_the_n_step_transitions_the_definition_gives():
    gamma, n = 0.9, 3
    replay = NStepReplay(1, 64, n, gamma, num_envs=1)
    rewards = [1.0, 2.0, 3.0, 4.0, 5.0]
    for t, r in enumerate(rewards):
        end = t == len(rewards) - 1
        replay.add(np.array([[t]], np.float32), [t % 2], [r], [end], [False], np.array([[t + 1]], np.float32))
    R, D = dqn.n_step_return(rewards, [False] * 4 + [True], gamma, n)
    assert replay.size == 5
    order = np.argsort(replay.observation[:5, 0])
    np.testing.assert_allclose(replay.ret[order], R, rtol=1e-6)
    np.testing.assert_allclose(replay.discount[order], D, rtol=1e-6)
    np.testing.assert_array_equal(replay.next_observation[order, 0], [3, 4, 5, 5, 5])
    np.testing.assert_array_equal(replay.action[order], [0, 1, 0, 1, 0])


def test_truncation_still_bootstraps():
    replay = NStepReplay(1, 8, 3, 0.5, num_envs=1)
    replay.add(np.zeros((1, 1), np.float32), [0], [1.0], [False], [True], np.ones((1, 1), np.float32))
    assert replay.discount[0] == pytest.approx(0.5) and replay.next_observation[0, 0] == 1


def test_learns_a_tiny_chain():
    """A 5-state chain: action 1 moves right (reward 1 at the end, which terminates), action 0 resets
    to the start. From uniformly random data (1-step targets: n-step ones are biased toward the
    behaviour policy off-policy) the greedy policy must go right everywhere, with Q near Q*."""
    spec = DictSpec.of(ArraySpec("observation", (5,), np.float32))
    config = dqn.DQNConfig(hidden_sizes=(32,), learning_rate=3e-3, discount=0.9, n_step=1, batch_size=32,
                           target_period=20, updates_per_call=4)
    networks, state = dqn.init(jax.random.key(0), spec, ArraySpec("action", (), np.int64, 0, 1), config)
    update = jax.jit(dqn.make_update_many(networks, config))
    replay = NStepReplay(5, 4096, config.n_step, config.discount, num_envs=1)
    rng = np.random.default_rng(0)
    eye = np.eye(5, dtype=np.float32)
    s = 0
    for _ in range(1500):
        a = int(rng.integers(2))
        s2 = min(s + 1, 4) if a == 1 else 0
        done = s2 == 4
        replay.add(eye[[s]], [a], [1.0 if done else 0.0], [done], [False], eye[[s2]])
        s = 0 if done else s2
    for _ in range(500):
        state, metrics = update(state, jax.tree.map(lambda *x: np.stack(x), *[replay.sample(rng, 32) for _ in range(4)]))
    q = np.asarray(networks.q_values(state.params, {"observation": eye[:4]}))
    assert (q.argmax(1) == 1).all(), q
    np.testing.assert_allclose(q[:, 1], [0.9**3, 0.9**2, 0.9, 1.0], atol=0.1)  # Q*(s, right) = gamma^(3-s)
    assert np.isfinite(float(metrics["td_loss"]))


def test_bad_action_specs_are_refused_by_name():
    spec = DictSpec.of(ArraySpec("observation", (3,), np.float32))
    with pytest.raises(ValueError, match="action"):
        dqn.make_networks(spec, ArraySpec("action", (2,), np.float32, -1.0, 1.0), (8,), jax.random.key(0))
