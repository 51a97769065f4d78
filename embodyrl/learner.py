"""The learner service: ingest steps, train off-policy (DDPG, TD3, SAC, RLPD) within a rate limit, publish weights.

One loop, never waiting on any single actor::

    poll the socket -> validated step batches -> replay.add
    group commit (every few ms or every chunk) -> ACK the batches it made durable
    grant credits while the samples-per-insert limiter lets actors insert
    if the limiter allows: K prefetched batches -> jitted scan of K updates
    every ``publish_every`` updates: publish versioned weights
    every ``log_every_s``: one line of metrics.jsonl

Credits carry the update-to-data ratio to the actors: the learner grants
rows only as fast as its updates allow (plus a tolerance), so a simulator
cannot outrun the learner and a slow simulator does not stall it more than
the ratio demands. The replay lives in ``run_dir/replay`` on disk: "acked"
means "survives a crash", and a learner started on an existing run directory
reopens it and resumes each actor's sequence numbers from its last commit.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from .checkpoint import Checkpointer
from .config import TrainConfig
from .episodes import EpisodeReturns
from .hal import params as flat_params
from .hal.specs import ArraySpec, DictSpec
from .hal.steps import PolicyVersion, new_incarnation
from .hal.wire.protocol import DeviceInfo
from .hal.wire.security import ServerKeys
from .policy import save_policy
from .replay import PersistentReplay, Prefetcher, RateLimiter
from .transport import LearnerServer, ReceivedSteps
from .transport.credits import GrantOrder


@dataclass
class Counters:
    env_steps: int = 0
    rows: int = 0
    episodes: int = 0
    updates: int = 0
    publications: int = 0


class Learner:
    def __init__(self, config: TrainConfig, observation_spec: DictSpec, action_spec: ArraySpec,
                 run_dir: Path, *, keys: ServerKeys | None = None, allow_insecure: bool = False,
                 layout=None):
        """``keys``: CurveZMQ for the actors' link; without them only loopback unless ``allow_insecure``.
        ``layout``: a :class:`~embodyrl.algos.heads.HeteroLayout` to train one policy over devices of
        different shapes (its padded specs replace ``observation_spec`` and ``action_spec``)."""
        self.config = config
        self.layout = layout
        self.algorithm = config.off_policy
        if layout is not None:
            from .algos.heads import hetero

            self.algorithm = hetero(self.algorithm, layout)
            observation_spec, action_spec = layout.observation_spec, layout.action_spec
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self.run_dir = Path(run_dir)
        self.incarnation = new_incarnation()
        lc = config.learner
        self.networks, self.state = self.algorithm.init(jax.random.key(config.seed), observation_spec, action_spec)
        self._update_many = jax.jit(self.algorithm.make_update_many(self.networks), donate_argnums=0)
        chunk = lc.replay_chunk_rows
        capacity = max(2, -(-lc.replay_capacity // chunk)) * chunk
        self.replay = PersistentReplay(self.run_dir / "replay", observation_spec, action_spec,
                                       capacity=capacity, chunk_rows=chunk,
                                       ram_budget_bytes=lc.replay_ram_budget_mb << 20,
                                       write_behind_bytes=256 << 10)  # image batches: pwrite overlaps ingest
        # updates are samples, rows are inserts: the ratio and tolerance of LearnerConfig
        self.limiter = RateLimiter(lc.updates_per_step, lc.min_replay, lc.updates_per_step * lc.rate_tolerance)
        if self.replay.reopened:
            self.limiter.restore(self.replay.size)
        self.server = LearnerServer(lc.bind, run_id=self.run_dir.name, incarnation=self.incarnation,
                                    admit=self._admit, peer_timeout_s=lc.peer_timeout_s,
                                    keys=keys, allow_insecure=allow_insecure,
                                    committed_seq=lambda actor_id: self.replay.committed_seqs.get(actor_id, 0))
        self.rng = np.random.default_rng(config.seed)
        self.counters = Counters()
        self._credit: dict[bytes, int] = {}  # session identity -> outstanding rows
        self._grant_order = GrantOrder()
        self._returns = EpisodeReturns()
        self._metrics: dict[str, float] = {}
        self._staleness: list[float] = []
        self._unacked: list[tuple] = []  # (session, seq) ingested, waiting for the group commit
        self._received: dict[int, int] = {}  # actor id -> newest seq ingested (committed or not)
        self._prefetch: Prefetcher | None = None
        self._io_last: dict = {}  # counters at the previous log line, for per-second rates
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints")
        self.resumed = self.checkpointer.latest_step() is not None
        if self.resumed:
            self._restore()

    def _restore(self) -> None:
        """Continue from the newest checkpoint: state, counters, and the limiter's samples."""
        self.state, record = self.checkpointer.restore(self.state)
        self.counters = Counters(**record["counters"])
        self.limiter.samples = self.counters.updates  # the updates really made, not the ratio's guess

    def checkpoint(self) -> None:
        self.checkpointer.save(self.counters.updates, self.state, {
            "counters": dataclasses.asdict(self.counters), "incarnation": self.incarnation,
            "algorithm": self.algorithm.name, "replay_size": self.replay.size})

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def version(self) -> PolicyVersion:
        return PolicyVersion(self.incarnation, self.counters.publications)

    def _admit(self, devices: list[DeviceInfo]) -> str | None:
        for d in devices:
            if self.layout is not None:  # heterogeneous: each device id has its declared kind
                reason = self.layout.refusal(d.device_id, d.name, d.observation_spec, d.action_spec)
                if reason is not None:
                    return reason
                continue
            if d.observation_spec != self.observation_spec or d.action_spec != self.action_spec:
                return f"device {d.name!r} has specs that differ from this learner's task"
        return None

    # -- the loop --------------------------------------------------------
    def run(self, should_stop=lambda: False) -> Counters:
        lc = self.config.learner
        self.publish()
        metrics_file = (self.run_dir / "metrics.jsonl").open("a")
        self._tb = _tensorboard_writer(self.run_dir / "tb")
        start = last_log = last_beat = last_checkpoint = time.monotonic()
        last_updates = 0
        try:
            while self.counters.env_steps < self.config.steps and not should_stop():
                trainable = self._can_train()
                for batch in self.server.poll(timeout_ms=0 if trainable else 10):
                    self._ingest(batch)
                if self.replay.maybe_commit(lc.replay_commit_interval_s):
                    self._ack_committed()
                self._grant_credits()
                if trainable:
                    self._train()
                now = time.monotonic()
                if now - last_beat >= 1.0:
                    self.server.heartbeat()
                    last_beat = now
                if now - last_checkpoint >= lc.checkpoint_every_s:
                    self.checkpoint()
                    last_checkpoint = now
                if now - last_log >= lc.log_every_s:
                    rate = (self.counters.updates - last_updates) / (now - last_log)
                    self._log(metrics_file, now - start, rate)
                    last_log, last_updates = now, self.counters.updates
        finally:
            self._log(metrics_file, time.monotonic() - start, 0.0)
            metrics_file.close()
            if self._tb is not None:
                self._tb.close()
            if self._prefetch is not None:
                self._prefetch.close()
            replay_error = self._final_commit()
            self.server.bye("training complete" if replay_error is None else "learner stopped: replay failed")
            self.save()
            self.checkpoint()
            self.checkpointer.close()
            self.server.close()
            self._close_replay(replay_error)
        if replay_error is not None:  # the loop ended normally, the last commit did not
            raise replay_error
        return self.counters

    def _final_commit(self) -> Exception | None:
        """Commit and ack what is left; a failure is returned (to raise once the model is saved
        and everything closed), never left to skip the rest: the acks sent stay true."""
        error = None
        try:
            self.replay.commit()
        except Exception as err:  # noqa: BLE001 - raised by run after the cleanup
            error = err
        self._ack_committed()  # only what a commit made durable, failed or not
        return error

    def _close_replay(self, replay_error: Exception | None) -> None:
        """Close the replay; after a failed commit as a crash would (its last commit stands)."""
        try:
            self.replay.close(commit=replay_error is None)
        except Exception:
            if replay_error is None:
                raise

    def _ingest(self, batch: ReceivedSteps) -> None:
        steps, actor = batch.steps, batch.session.actor_id
        self._unacked.append((batch.session, batch.seq))
        if batch.seq <= self._received.get(actor, 0):  # a resend of rows not yet committed
            return
        self._received[actor] = batch.seq
        if self.layout is not None:
            steps = self.layout.pad_steps(batch.device_id, steps)
        self.replay.add(steps, seq=batch.seq)
        self.limiter.record_insert(len(steps))
        c = self.counters
        c.rows += len(steps)
        c.env_steps += steps.env_steps
        self._credit[batch.session.identity] = self._credit.get(batch.session.identity, 0) - len(steps)
        self.counters.episodes += self._returns.add(steps)
        live = ~steps.final & (steps.policy_incarnation == self.incarnation)
        if live.any():
            self._staleness.append(float(np.mean(c.publications - steps.policy_count[live])))

    def _ack_committed(self) -> None:
        """Ack what the last group commit made durable: one cumulative ACK per actor."""
        committed = self.replay.committed_seqs
        waiting, newest = [], {}
        for session, seq in self._unacked:
            if seq <= committed.get(session.actor_id, 0):
                newest[session.identity] = (session, max(seq, newest.get(session.identity, (None, 0))[1]))
            else:
                waiting.append((session, seq))
        for session, seq in newest.values():
            self.server.ack(session, seq)
        self._unacked = waiting

    def _can_train(self) -> bool:
        lc = self.config.learner
        return self.replay.size >= lc.min_replay and self.limiter.can_sample(lc.updates_per_call)

    def _grant_credits(self) -> None:
        lc = self.config.learner
        sessions = self.server.sessions
        for identity in list(self._credit):
            if identity not in sessions:
                del self._credit[identity]
                self._grant_order.forget(identity)
        for identity, session in self._grant_order.order(sessions, self._credit):
            outstanding = sum(max(v, 0) for v in self._credit.values())
            if not self.limiter.can_insert(outstanding + lc.credit_quantum):
                return
            if self._credit.get(identity, 0) < lc.credit_quantum:
                self._credit[identity] = self._credit.get(identity, 0) + lc.credit_quantum
                self.server.grant(session, lc.credit_quantum)
                self._grant_order.granted(identity)

    def _sample_call(self) -> dict:
        """One training call's K batches, stacked: numpy arrays ready for the device."""
        lc, algo = self.config.learner, self.algorithm
        batches = [self.replay.sample(self.rng, algo.batch_size, algo.discount, lc.n_step)
                   for _ in range(lc.updates_per_call)]
        return jax.tree.map(lambda *xs: np.stack(xs), *batches)

    def _train(self) -> None:
        lc = self.config.learner
        if lc.prefetch_batches == 0:
            stacked = self._sample_call()
        else:
            if self._prefetch is None:
                self._prefetch = Prefetcher(self._sample_call, depth=lc.prefetch_batches)
            stacked = self._prefetch.get()
        self.state, metrics = self._update_many(self.state, stacked)
        self.limiter.record_sample(lc.updates_per_call)
        before = self.counters.updates
        self.counters.updates += lc.updates_per_call
        if self.counters.updates // lc.publish_every > before // lc.publish_every:
            self.publish()
            self._metrics = {k: float(v) for k, v in metrics.items()}

    # -- weights ---------------------------------------------------------
    def actor_weights(self) -> dict[str, np.ndarray]:
        actor = jax.device_get(self.state.actor_params)
        return flat_params.flatten({"actor": actor})

    def publish(self) -> None:
        self.counters.publications += 1
        self.server.publish(self.version, self.actor_weights())

    def save(self) -> None:
        save_policy(self.run_dir / "policy", self.version, self.actor_weights(),
                    self.observation_spec, self.action_spec, self.algorithm)

    def _io_rates(self, elapsed: float) -> dict[str, float]:
        st = self.server.stats
        return _rates(elapsed, {"messages_in": st.messages_in, "bytes_in": st.bytes_in,
                                "messages_out": st.messages_out, "bytes_out": st.bytes_out}, self._io_last)

    def _log(self, file, elapsed: float, updates_per_s: float) -> None:
        c = self.counters
        by_device = self._returns.take_finished_by_device()
        returns = [total for _, total in by_device]
        staleness, self._staleness = self._staleness, []
        record = {
            "time": round(elapsed, 3), "env_steps": c.env_steps, "episodes": c.episodes,
            "episode_return": float(np.mean(returns)) if returns else None,
            "updates": c.updates, "updates_per_s": round(updates_per_s, 1),
            "policy_version": c.publications, "replay_size": self.replay.size,
            "replay_commits": self.replay.commits,
            "actors": len(self.server.sessions),
            "policy_lag": float(np.mean(staleness)) if staleness else None,
            "rejected": sum(self.server.stats.rejected.values()),
            "rejected_by_reason": dict(self.server.stats.rejected),
            "messages_in": self.server.stats.messages_in, "bytes_in": self.server.stats.bytes_in,
            "messages_out": self.server.stats.messages_out, "bytes_out": self.server.stats.bytes_out,
            **self._io_rates(elapsed),
            "batches_awaiting_commit": len(self._unacked), "rows_awaiting_commit": self.replay.store.pending_rows,
            "duplicates_dropped": self.server.stats.duplicates,
            "weights_sent": dict(self.server.publisher.sent),
            **self._metrics,
        }
        if self.layout is not None:  # a curve per device kind: episode_return/<task>
            for device_id, kind in enumerate(self.layout.kinds):
                mine = [total for d, total in by_device if d == device_id]
                record[f"episode_return/{kind.name}"] = float(np.mean(mine)) if mine else None
        file.write(json.dumps(record) + "\n")
        file.flush()
        if getattr(self, "_tb", None) is not None:
            for name, value in record.items():  # the same scalars; dicts and absent values skipped
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(name, value, global_step=c.env_steps, walltime=None)
            self._tb.flush()


def _rates(now: float, counts: dict[str, int], last: dict) -> dict[str, float]:
    """Per-second rates of growing counters since the previous call (``last`` is updated)."""
    dt = now - last.get("time", 0.0)
    rates = {f"{k}_per_s": round((v - last.get(k, 0)) / dt, 1) if dt > 0 else 0.0 for k, v in counts.items()}
    last.update(counts, time=now)
    return rates


def _tensorboard_writer(directory: Path):
    """A tensorboardX writer for ``directory``, or None where tensorboardX is not installed."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(directory), flush_secs=5)
