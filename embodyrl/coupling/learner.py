"""The learner side of a coupled model: a per-level DDPG over column steps from many ranks.

Ranks stream column steps (:mod:`embodyrl.hal.coupling`); this learner
receives them through the ordinary :class:`~embodyrl.transport.server.LearnerServer`,
keeps them in a RAM ring (:class:`ColumnRing`, the data side of the ordinary
:class:`~embodyrl.learner.LearnerService`), trains DDPG with the repository's pure update
(:func:`embodyrl.algos.ddpg.make_update_many`) and publishes the actor's
weights to every rank directly.

The networks are shared across levels: the actor maps one level's input
window (:func:`embodyrl.hal.coupling.level_inputs`) to that level's
correction, and the critic is a mean over levels of one shared per-level
term, ``Q(o, a) = mean_k q(window_k, a_k)``. The reward the link computes,
``-mean_k ((a_k - target_k) / bound) ** 2``, is itself such a mean, so the
decomposition loses nothing and each level's actor gradient comes from its
own term. That term is quadratic in the action, ``q = v(w) - softplus(c(w))
(a - m(w))^2`` (a normalised-advantage head, Gu et al. 2016), because the
reward is: a plain MLP critic over (window, action) had to find that shape
from a mean of 70 levels, and in our development runs its errors drove the
actor to the bounds. The actor still learns only by ascending the critic
(DDPG's update, unchanged). :class:`ColumnNetworks` offers the interface the DDPG losses use
(``policy``, ``q_values``, ``q_value``, ``scale``), so the update is DDPG's
own, not a copy.

The discount is 0. The nudging increment at step t is the correction the
model needed at step t, known when the step is recorded; with the nudged
state held near the analysis, a correction's later consequences are erased
by the nudging itself (and depend on its time scale, not on the policy), so
bootstrapping would add critic bias and no information. Rows therefore
arrive ``terminated`` and carry no successor.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..algos import ddpg
from ..algos.ddpg.export import export_ddpg
from ..algos.networks import MLP, ActionScale
from ..hal import params
from ..hal.coupling.link import CouplingConfig
from ..hal.steps import PolicyVersion, new_incarnation
from ..hal.wire.security import ServerKeys
from ..learner.metrics import MetricsLog
from ..learner.service import LearnerService, Training
from ..transport.server import LearnerServer


def level_windows(profile: jax.Array, context: jax.Array | None, radius: int) -> jax.Array:
    """JAX twin of :func:`embodyrl.hal.coupling.level_inputs`."""
    levels = profile.shape[-2]
    index = np.clip(np.arange(levels)[:, None] + np.arange(-radius, radius + 1)[None, :], 0, levels - 1)
    window = profile[..., index, :].reshape(*profile.shape[:-2], levels, -1)
    if context is None:
        return window
    ctx = jnp.broadcast_to(context[..., None, :], (*context.shape[:-1], levels, context.shape[-1]))
    return jnp.concatenate([window, ctx], axis=-1)


@dataclass(frozen=True, eq=False)
class ColumnNetworks:
    """Per-level actor and critic over column observations (see the module docstring)."""

    coupling: CouplingConfig
    actor_graph: nnx.GraphDef
    critic_graph: nnx.GraphDef
    scale: ActionScale
    encoder: None = None
    """No image encoder (the DDPG update asks)."""

    def windows(self, observation) -> jax.Array:
        context = observation.get("context") if self.coupling.context else None
        return level_windows(jnp.asarray(observation["profile"], jnp.float32),
                             None if context is None else jnp.asarray(context, jnp.float32), self.coupling.radius)

    def policy(self, actor_params, observation) -> jax.Array:
        unit = jnp.tanh(nnx.merge(self.actor_graph, actor_params)(self.windows(observation)))[..., 0]
        return self.scale.to_env(unit)

    def q_values(self, critic_params, observation, action) -> jax.Array:
        """[critics, batch...]: every critic's mean over levels of its per-level term
        ``q = v(w) - softplus(c(w)) * (a - m(w)) ** 2`` (action in [-1, 1] units)."""
        w, a = self.windows(observation), self.scale.to_unit(action)

        def one(p):
            m, c, v = jnp.moveaxis(nnx.merge(self.critic_graph, p)(w), -1, 0)
            return jnp.mean(v - jax.nn.softplus(c) * (a - jnp.tanh(m)) ** 2, axis=-1)

        return jax.vmap(one)(critic_params)

    def q_value(self, critic_params, observation, action) -> jax.Array:
        return self.q_values(critic_params, observation, action)[0]

    def level_networks(self) -> ddpg.DDPGNetworks:
        """The actor seen as an ordinary DDPG actor over one level's window (for export)."""
        level_action = self.coupling.level_action_spec()
        return ddpg.DDPGNetworks(self.coupling.level_observation_spec(), level_action,
                                 self.actor_graph, self.critic_graph, ActionScale(level_action))


def init(key: jax.Array, coupling: CouplingConfig, config: ddpg.DDPGConfig) -> tuple[ColumnNetworks,
                                                                                      ddpg.TrainingState]:
    """Fresh networks and a DDPG training state for them."""
    actor_key, state_key, *critic_keys = jax.random.split(key, 2 + config.num_critics)
    actor_graph, actor = nnx.split(MLP(coupling.window, config.hidden_sizes, 1, rngs=nnx.Rngs(actor_key)))
    critics = [nnx.split(MLP(coupling.window, config.hidden_sizes, 3, rngs=nnx.Rngs(k))) for k in critic_keys]
    critic = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.to_pure_dict(s) for _, s in critics])
    actor = nnx.to_pure_dict(actor)
    networks = ColumnNetworks(coupling, actor_graph, critics[0][0], ActionScale(coupling.action_spec()))
    return networks, ddpg.initial_state(state_key, actor, critic, config)


def critic_centred_on(critic_params, actor_params):
    """The critics (stacked) with their hidden layers and their centre head ``m`` (output 0) copied
    from the actor, so that ``tanh(m(w))`` is the actor's unit action for every window; the
    curvature and value heads (outputs 1 and 2) keep their own weights. The two networks have the
    same input and hidden sizes (:func:`init`)."""
    layers = dict(critic_params["layers"])
    last = max(layers)
    for i, layer in actor_params["layers"].items():
        stacked = layers[i]
        critics = stacked["kernel"].shape[0]
        if i != last:
            layers[i] = {k: jnp.broadcast_to(v, (critics, *v.shape)) for k, v in layer.items()}
        else:
            layers[i] = {k: stacked[k].at[:, ..., 0].set(layer[k][..., 0]) for k in ("kernel", "bias")}
    return {**critic_params, "layers": layers}


def export_policy(networks: ColumnNetworks, actor_params, config: ddpg.DDPGConfig,
                  version: PolicyVersion) -> tuple[dict, dict[str, np.ndarray]]:
    """(graph, arrays) of the per-level actor for :class:`~embodyrl.hal.runtime.NumpyPolicy`."""
    return export_ddpg(networks.level_networks(), actor_params, config, version)


@dataclass(frozen=True)
class CouplingLearnerConfig:
    ddpg: ddpg.DDPGConfig = field(default_factory=lambda: ddpg.DDPGConfig(
        hidden_sizes=(64, 64), discount=0.0, actor_lr=1e-3, critic_lr=3e-3, batch_size=64,
        exploration_noise=0.1, tau=0.01))
    """DDPG settings; batch_size counts columns (each brings all its levels)."""
    capacity: int = 200_000
    """Column steps kept in the RAM ring."""
    min_steps: int = 2_000
    """Column steps held before the first update."""
    updates_per_call: int = 20
    """Updates fused in one jitted scan."""
    publish_every: int = 100
    """Updates between weight publications."""
    seed: int = 0


class ColumnRing:
    """The coupling learner's data side: column steps in a RAM ring, uniform batches of K x B columns.

    Rows arrive from every rank and are acknowledged as they are taken (a coupled model's steps
    are not worth a disk); credits are kept topped up, so a rank never waits on them.
    """

    CREDIT = 1 << 30

    def __init__(self, coupling: CouplingConfig, config: CouplingLearnerConfig):
        self.coupling, self.config = coupling, config
        n, L, F, C = config.capacity, coupling.levels, coupling.features, max(coupling.context, 1)
        self._profile = np.zeros((n, L, F), np.float32)
        self._context = np.zeros((n, C), np.float32)
        self._action = np.zeros((n, L), np.float32)
        self._reward = np.zeros(n, np.float32)
        self.size = self._next = 0
        self._rng = np.random.default_rng(config.seed)
        self._taken: dict[int, int] = {}
        self.steps_by_rank: dict[int, int] = {}

    def add(self, steps, seq: int, actor_id: int) -> int:
        live = ~steps.final
        rows = int(live.sum())
        idx = (self._next + np.arange(rows)) % self.config.capacity
        self._profile[idx] = steps.observation["profile"][live]
        if self.coupling.context:
            self._context[idx] = steps.observation["context"][live]
        self._action[idx] = steps.action[live]
        self._reward[idx] = steps.reward[live]
        self._next = (self._next + rows) % self.config.capacity
        self.size = min(self.size + rows, self.config.capacity)
        self.steps_by_rank[actor_id] = self.steps_by_rank.get(actor_id, 0) + rows
        self._taken[actor_id] = seq
        return 0

    def commit(self, final: bool = False) -> bool:
        return True

    def durable(self) -> dict[int, int]:
        return self._taken

    def grant_credits(self, server) -> None:
        for session in server.sessions.values():
            held = server.credits.held(session.identity)
            if held < self.CREDIT // 2:  # topped up: a rank streams without waiting
                server.grant(session, self.CREDIT - held)

    def trainable(self) -> bool:
        return self.size >= self.config.min_steps

    def _batches(self, size: int) -> dict:
        k, b = self.config.updates_per_call, self.config.ddpg.batch_size
        idx = self._rng.integers(0, size, size=(k, b))
        obs = {"profile": self._profile[idx]}
        if self.coupling.context:
            obs["context"] = self._context[idx]
        # discount 0 multiplies the bootstrap by zero: one column stands in for the next
        # observations, so the target networks' pass costs nothing
        one = {k: v[:, :1] for k, v in obs.items()}
        return {"observation": obs, "next_observation": one, "action": self._action[idx],
                "reward": self._reward[idx], "discount": np.zeros((k, b), np.float32)}

    def batch(self) -> tuple[dict, dict]:
        return self._batches(self.size), {}

    def example_batch(self) -> dict:
        return self._batches(1)

    def trained(self, updates: int) -> None:
        pass

    def owed(self) -> int:
        return 0  # no step budget: the ring trains as long as the model runs

    def published(self, version: PolicyVersion) -> int:
        return 0

    def restored(self, counters) -> None:
        pass

    def metrics(self) -> dict:
        return {"column_steps": self.size}

    def close(self, failed: bool) -> None:
        pass


class CouplingLearner:
    """Receives column steps from every rank, trains, publishes (one process), on the learner service."""

    def __init__(self, coupling: CouplingConfig, config: CouplingLearnerConfig = CouplingLearnerConfig(),
                 bind: str = "tcp://127.0.0.1:*", keys: ServerKeys | None = None, allow_insecure: bool = False,
                 metrics_dir: str | Path | None = None):
        """``keys``: CurveZMQ (the learner's secret key and the ranks' public keys); a ``bind`` off this
        machine needs them, or ``allow_insecure``. ``metrics_dir``: where the service writes its
        ``metrics.jsonl`` (a record a second, as every learner's: updates, losses, column steps),
        TensorBoard beside it; a coupling learner keeps no checkpoint, so each one is a new training
        and replaces the curve an earlier one left there."""
        if config.ddpg.discount != 0.0:
            raise ValueError("coupled-model steps carry no successor: ddpg.discount must be 0")
        self.coupling = coupling
        self.config = config
        self.networks, state = init(jax.random.key(config.seed), coupling, config.ddpg)
        incarnation = new_incarnation()
        self.ring = ColumnRing(coupling, config)
        training = Training(self.networks, state, ddpg.make_update_many(self.networks, config.ddpg),
                            lambda s: s.actor_params, name="coupling", updates_per_call=config.updates_per_call,
                            publish_every=config.publish_every)
        server = LearnerServer(bind, run_id=f"coupling-{incarnation:x}", incarnation=incarnation, keys=keys,
                               allow_insecure=allow_insecure)
        sink = None
        if metrics_dir is not None:
            metrics_dir = Path(metrics_dir)
            metrics_dir.mkdir(parents=True, exist_ok=True)
            (metrics_dir / "metrics.jsonl").unlink(missing_ok=True)
            shutil.rmtree(metrics_dir / "tb", ignore_errors=True)
            sink = MetricsLog(metrics_dir)
        self.service = LearnerService(server, self.ring, training, incarnation=incarnation, metrics_sink=sink)
        self.server = server
        self.endpoint = server.endpoint

    # -- what the experiments read ------------------------------------------------
    @property
    def state(self):
        return self.service.state

    @property
    def size(self) -> int:
        return self.ring.size

    @property
    def steps_by_rank(self) -> dict[int, int]:
        return self.ring.steps_by_rank

    @property
    def updates(self) -> int:
        return self.service.counters.updates

    @property
    def published(self) -> int:
        return self.service.counters.publications

    @property
    def metrics(self) -> dict[str, float]:
        return self.service.train_metrics

    def warm_start(self, arrays: dict[str, np.ndarray]) -> None:
        """Start the actor (and its target) from another policy's exported weights of the same network
        (``actor/...``: an offline fit, or a policy trained another way), and every critic's centre
        ``m(w)`` from it too (:func:`critic_centred_on`): the critic starts out believing that the
        policy it starts from acts best, and only its data move it from there. The critic's value and
        curvature heads stay fresh, and the optimisers start again. Published at once."""
        actor = params.unflatten(params.subtree(arrays, "actor"))
        state = self.service.training.host_state()
        ours = state.actor_params
        if jax.tree.structure(actor) != jax.tree.structure(ours) or any(
                np.shape(a) != np.shape(b) for a, b in zip(jax.tree.leaves(actor), jax.tree.leaves(ours), strict=True)):
            raise ValueError("warm start: the weights are not this learner's actor network")
        actor = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), actor)
        state = ddpg.initial_state(state.key, actor, critic_centred_on(state.critic_params, actor),
                                   self.config.ddpg)
        self.service.state = self.service.training.place(state)
        self.publish()

    def start_at_zero(self) -> None:
        """Warm-start from this learner's own actor with its output layer zeroed: the policy answers 0
        everywhere and the critic's centre is there (a residual on top of another correction starts
        as nothing and learns only what that correction lacks)."""
        _, arrays = self.export()
        last = max(int(name.split("/")[2]) for name in arrays if name.startswith("actor/layers/"))
        self.warm_start({name: np.zeros_like(a) if name.startswith(f"actor/layers/{last}/") else a
                         for name, a in arrays.items()})

    # -- serving ---------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0) -> int:
        """Take arrived step batches into the ring and acknowledge them; return rows taken."""
        return self.service.poll(timeout_ms)

    def warm_up(self) -> None:
        """Compile the fused update once (on a copy of the state), before ranks depend on this
        process answering: a first compile under load can outlast a link's patience."""
        self.service.warm_up()

    def train(self) -> bool:
        """One fused chunk of updates when enough steps are held; publish when due."""
        return self.service.train()

    def publish(self) -> None:
        self.service.publish()

    def actor_arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v, np.float32) for k, v in self.service.training.actor_weights().items()}

    def export(self) -> tuple[dict, dict[str, np.ndarray]]:
        return export_policy(self.networks, self.state.actor_params, self.config.ddpg, self.service.version)

    def run(self, duration_s: float, stop=None) -> None:
        """Poll and train for ``duration_s`` seconds (or until ``stop()`` says so)."""
        deadline = time.monotonic() + duration_s
        self.service.serve(lambda: time.monotonic() >= deadline or bool(stop and stop()))

    def close(self) -> None:
        self.service.shutdown("coupling learner closed")
