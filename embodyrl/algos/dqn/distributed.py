"""Neural distributed Q-learning: learners with their own actors and replay, agreeing on parameters.

Each learner runs double DQN on its own environments and replay. Every
``epoch_steps`` environment steps (per learner) the learners mix their
online and target parameters with their neighbours' for ``rounds``
consensus rounds through an exchange with their neighbours
(:data:`~embodyrl.algos.consensus.Exchange`; :mod:`embodyrl.learner.consensus`
runs a team with peer links plugged in),
``theta_i <- sum_j W_ij theta_j`` with a mixing matrix W over a
communication graph (:mod:`embodyrl.algos.vrdq.graphs`). The epoch length
is the communication knob: messages per learner are ``rounds * degree``
per epoch, whatever the network's size in steps. Optimiser states stay
local. On the complete graph with W = 1/N, one round is the exact average.

After each epoch every learner evaluates its greedy policy and shares the
result in one more round; all stop when the mean reaches the target (the
same decision everywhere on the complete graph, where everyone hears
everyone). The stopping rule's episodes decide when to stop, so their
return is selected and flatters the policy; after stopping each learner
scores its policy again on ``report_episodes`` fresh seeds that no decision
saw (``report_return``), and that is the figure to report.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import jax
import numpy as np

from ...hal import params as flat_params
from ...hal.specs import ArraySpec, DictSpec
from ..consensus import Exchange, Traffic, no_traffic
from .config import DQNConfig
from .learning import act, init, make_update_many
from .replay import NStepReplay

FIELD = "observation"
STOP_SEEDS = 10_000
"""The stopping rule's evaluation episodes start here; the reported figure's at REPORT_SEEDS."""
REPORT_SEEDS = 1_000_000


@dataclass(frozen=True)
class RunConfig:
    env_id: str = "CartPole-v1"
    """A Gymnasium environment with a Box observation and a Discrete action space."""
    num_envs: int = 4
    """Environments each learner's actor steps in lockstep (one batched action per step)."""
    max_env_steps: int = 100_000
    """Per learner: give up after this many environment steps."""
    epoch_steps: int = 2_000
    """Environment steps per learner between consensus phases: the communication knob."""
    rounds: int = 1
    """Consensus rounds per epoch."""
    target_return: float = 475.0
    """Stop when the learners' mean greedy evaluation return reaches this."""
    eval_episodes: int = 10
    """Episodes of the stopping rule's evaluation, on seeds ``STOP_SEEDS + 100 * seed + i``."""
    report_episodes: int = 20
    """After stopping, the greedy policy's return on this many fresh seeds (``REPORT_SEEDS + ...``):
    the figure reported, never seen by the stopping rule."""
    learning_starts: int = 1_000
    """Transitions in the local replay before the first gradient step."""
    updates_per_step: float = 0.25
    """Gradient steps per environment step."""
    replay_capacity: int = 50_000
    round_timeout_s: float = 120.0
    seed: int = 0


def _flat(state) -> dict[str, np.ndarray]:
    return flat_params.flatten({"online": jax.device_get(state.params), "target": jax.device_get(state.target_params)})


def mix(own: dict[str, np.ndarray], weight_self: float, received: dict[int, dict[str, np.ndarray]],
        weights: dict[int, float]) -> dict[str, np.ndarray]:
    """One consensus step: ``W_ii theta_i + sum_j W_ij theta_j`` over the neighbours heard."""
    return {k: weight_self * v + sum(weights[j] * received[j][k] for j in received) for k, v in own.items()}


def parameter_spread(flats: list[dict[str, np.ndarray]]) -> float:
    """Mean distance of the learners' parameter vectors from their average, relative to its norm."""
    vectors = np.stack([np.concatenate([f[k].ravel() for k in sorted(f)]) for f in flats])
    mean = vectors.mean(0)
    return float(np.mean(np.linalg.norm(vectors - mean, axis=1)) / (np.linalg.norm(mean) + 1e-12))


def consensus_round(exchange: Exchange, round_: int, W: np.ndarray, index: int,
                    flat: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """Send ``flat`` to the neighbours, mix what they sent with row ``index`` of W; also return the
    spread of the parameters this learner saw (its own and its neighbours') before mixing."""
    neighbours = {int(j) for j in np.flatnonzero(W[index]) if j != index}
    got = exchange(round_, flat, neighbours)
    if set(got) != neighbours:
        raise TimeoutError(f"learner {index}: neighbours {sorted(neighbours - set(got))} missed round {round_}")
    spread = parameter_spread([flat, *got.values()])
    return mix(flat, float(W[index, index]), got, {j: float(W[index, j]) for j in neighbours}), spread


def _specs(env) -> tuple[DictSpec, ArraySpec]:
    from gymnasium import spaces

    if not isinstance(env.action_space, spaces.Discrete) or not isinstance(env.observation_space, spaces.Box):
        raise ValueError(f"{env.spec.id}: needs a Box observation and a Discrete action space")
    obs = DictSpec.of(ArraySpec(FIELD, env.observation_space.shape, np.float32))
    return obs, ArraySpec("action", (), np.int64, 0, int(env.action_space.n) - 1)


def evaluate(env_id: str, networks, params, episodes: int, seed: int) -> float:
    """Mean return of the greedy policy over ``episodes`` seeded episodes stepped in lockstep."""
    import gymnasium

    envs = [gymnasium.make(env_id) for _ in range(episodes)]
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]).astype(np.float32)
    returns, live = np.zeros(episodes), np.ones(episodes, bool)
    greedy = jax.jit(lambda p, o: networks.q_values(p, {FIELD: o}).argmax(-1))
    while live.any():
        actions = np.asarray(greedy(params, obs))
        for i in np.flatnonzero(live):
            o, r, term, trunc, _ = envs[i].step(int(actions[i]))
            returns[i] += r
            obs[i] = o
            live[i] = not (term or trunc)
    for e in envs:
        e.close()
    return float(returns.mean())


def run_learner(index: int, W: np.ndarray, dqn: DQNConfig, run: RunConfig, exchange: Exchange | None = None,
                traffic: Traffic = no_traffic) -> dict:
    """One learner's whole run; returns its history, one record per epoch. ``exchange``: how it talks
    to its neighbours in W (None: a team of one)."""
    import gymnasium

    started = time.monotonic()
    envs = [gymnasium.make(run.env_id) for _ in range(run.num_envs)]
    observation_spec, action_spec = _specs(envs[0])
    # one initialisation for all: averaging networks from different inits mixes unrelated hidden units
    networks, state = init(jax.random.key(run.seed), observation_spec, action_spec, dqn)
    update_many = jax.jit(make_update_many(networks, dqn))
    act_fn = jax.jit(lambda p, o, k, e: act(networks, p, {FIELD: o}, k, e))
    replay = NStepReplay(observation_spec[FIELD].size, run.replay_capacity, dqn.n_step, dqn.discount, run.num_envs)
    rng = np.random.default_rng(run.seed * 100 + index)
    key = jax.random.key(run.seed * 100 + index + 1)
    obs = np.stack([e.reset(seed=run.seed * 1000 + index * run.num_envs + i)[0]
                    for i, e in enumerate(envs)]).astype(np.float32)
    env_steps, updates, owed, round_, history, episode_returns = 0, 0, 0.0, 0, [], []
    running = np.zeros(run.num_envs)
    neighbours = {int(j) for j in np.flatnonzero(W[index]) if j != index}
    try:
        while env_steps < run.max_env_steps:
            for _ in range(run.epoch_steps // run.num_envs):
                key, step_key = jax.random.split(key)
                actions = np.asarray(act_fn(state.params, obs, step_key, dqn.epsilon(env_steps)))
                stepped = [e.step(int(a)) for e, a in zip(envs, actions, strict=True)]
                next_obs = np.stack([s[0] for s in stepped]).astype(np.float32)
                rewards = np.array([s[1] for s in stepped], np.float32)
                term = np.array([s[2] for s in stepped])
                trunc = np.array([s[3] for s in stepped])
                replay.add(obs, actions, rewards, term, trunc, next_obs)
                running += rewards
                for i in np.flatnonzero(term | trunc):
                    episode_returns.append(running[i])
                    running[i] = 0.0
                    next_obs[i] = envs[i].reset()[0]
                obs = next_obs
                env_steps += run.num_envs
                if replay.size >= run.learning_starts:
                    owed += run.num_envs * run.updates_per_step
                    while owed >= dqn.updates_per_call:
                        batches = [replay.sample(rng, dqn.batch_size) for _ in range(dqn.updates_per_call)]
                        state, _ = update_many(state, jax.tree.map(lambda *xs: np.stack(xs), *batches))
                        owed -= dqn.updates_per_call
                        updates += dqn.updates_per_call
            spread_before = None
            if exchange is not None:
                flat = _flat(state)
                for r in range(run.rounds):
                    flat, spread = consensus_round(exchange, round_, W, index, flat)
                    spread_before = spread if r == 0 else spread_before
                    round_ += 1
                tree = flat_params.unflatten(flat)
                state = state._replace(params=jax.tree.map(jax.numpy.asarray, tree["online"]),
                                       target_params=jax.tree.map(jax.numpy.asarray, tree["target"]))
            score = evaluate(run.env_id, networks, state.params, run.eval_episodes, seed=STOP_SEEDS + run.seed * 100)
            scores = [score]
            if exchange is not None:  # everyone hears everyone's score on the complete graph: one decision
                got = exchange(round_, {"score": np.array([score])}, neighbours)
                round_ += 1
                scores += [float(v["score"][0]) for v in got.values()]
            history.append({"epoch": len(history) + 1, "env_steps": env_steps, "updates": updates,
                            "wall_s": round(time.monotonic() - started, 2), "eval_return": score,
                            "team_eval_return": float(np.mean(scores)),
                            "train_return": float(np.mean(episode_returns[-20:])) if episode_returns else None,
                            "spread_before": spread_before, **traffic()})
            if np.mean(scores) >= run.target_return:
                break
        report = evaluate(run.env_id, networks, state.params, run.report_episodes,
                          seed=REPORT_SEEDS + run.seed * 1000)  # the same fresh seeds for every learner
    finally:
        for e in envs:
            e.close()
    return {"index": index, "history": history, "report_return": report, "config": asdict(run), "dqn": asdict(dqn)}
