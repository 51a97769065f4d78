"""The real coupling learner on a loopback port, in a thread: what a test drives coupled ranks and
links against, instead of a second implementation of the learner's loop (the coupling twin of
:class:`~embodyrl.learner.testing.ServedLearner`).

::

    served = ServedCoupling(cfg)
    try:
        policy = served.export(tmp_path / "policy")   # its own actor, as `embodyrl learner coupling` writes it
        link = CouplingLink(replace(cfg, learner=served.endpoint), rank, runtime.load(policy))
        ...                                           # the ranks' side, as in a run
        served.wait(lambda c: c.steps_by_rank.get(rank, 0) >= 40)
    finally:
        served.close()
    served.taken                                      # every batch its ring took, in order

Everything between the socket and the ring is the learner's own: :class:`CouplingLearner`'s
:class:`~embodyrl.transport.LearnerServer` (handshake, incarnation checks, limits), the
:class:`~embodyrl.learner.LearnerService` loop (ACKs, credits, heartbeats, publication) and its
:class:`ColumnRing`. It never trains (``min_steps`` past any test's rows) and publishes only when
the test asks (:meth:`ServedCoupling.publish`). A policy a link streams under must be this
learner's (:meth:`ServedCoupling.export`): its server refuses rows acted under an incarnation it
never had. :func:`random_export` writes the same export of fresh weights without a learner, for a
link that streams nowhere.

JAX is imported inside the functions, not here, so that importing this module costs nothing more
than its package does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..hal import runtime
from ..hal.coupling.link import CouplingConfig
from ..hal.steps import PolicyVersion
from ..learner.testing import BetweenTurns


def small_ddpg():
    """A small actor: each rank's numpy replica answers quickly, and the learner's JAX init is cheap."""
    from ..algos.ddpg import DDPGConfig

    return DDPGConfig(hidden_sizes=(8,), discount=0.0)


def random_export(directory: Path, version: PolicyVersion, *, cfg: CouplingConfig, seed: int = 0,
                  name: str = "policy") -> Path:
    """``directory / name``: the coupling learner's export (what ``embodyrl learner coupling`` writes)
    of fresh random weights (``seed``) for links of shape ``cfg``, tagged ``version``."""
    import jax

    from .learner import export_policy, init

    config = small_ddpg()
    networks, state = init(jax.random.key(seed), cfg, config)
    path = Path(directory) / name
    runtime.save(path, *export_policy(networks, state.actor_params, config, version))
    return path


class ServedCoupling(BetweenTurns):
    """The real coupling learner (:class:`~embodyrl.coupling.CouplingLearner`: its LearnerServer,
    LearnerService loop and ColumnRing) serving on a loopback port in a daemon thread until
    :meth:`close`.

    ``cfg``: the links' shape; ``seed``: its initial weights; ``peer_timeout_s``: its server's
    silence limit, set before it serves (the server reads it at each poll and tells each link in
    its WELCOME). ``taken``: every batch the service handed its ring, in order (resends are dropped
    before the ring). The learner's sessions and counters belong to its thread: ask through
    :meth:`read` or :meth:`wait`, or read them after :meth:`close`.
    """

    def __init__(self, cfg: CouplingConfig, *, seed: int = 0, peer_timeout_s: float | None = None):
        from ..learner.testing import NEVER, Taken
        from .learner import CouplingLearner, CouplingLearnerConfig

        self.cfg = cfg
        self.learner = CouplingLearner(cfg, CouplingLearnerConfig(ddpg=small_ddpg(), capacity=1 << 13,
                                                                  min_steps=NEVER, seed=seed))
        if peer_timeout_s is not None:  # before the thread starts: no session has been told another yet
            self.learner.server.peer_timeout_s = peer_timeout_s
        self.endpoint = self.learner.endpoint
        self.taken: list[Taken] = []
        add = self.learner.ring.add

        def recorded(steps, seq, actor_id):  # the ring as it is, keeping each batch for the test to read
            self.taken.append(Taken(steps, seq, actor_id))
            return add(steps, seq, actor_id)

        self.learner.ring.add = recorded
        BetweenTurns.__init__(self)
        self._due: list[list] = []
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="served-coupling", daemon=True)
        self._thread.start()

    # -- the learner's thread ----------------------------------------------------------
    def _run(self) -> None:
        try:
            try:
                self.learner.run(3600.0, stop=self._turn)
            finally:
                self.learner.close()  # the service's shutdown: final ACKs, BYE, sockets closed
        except BaseException as err:  # noqa: BLE001 - raised by close()
            self.error = err

    def _turn(self) -> bool:
        """Between two of the service's turns: answer the test's questions, do what fell due."""
        self._answer(self.learner)
        now = time.monotonic()
        for due in list(self._due):
            condition, action, delay_s, since = due
            if since is None and condition(self.learner):
                due[3] = since = now
            if since is not None and now - since >= delay_s:
                action(self.learner)
                self._due.remove(due)
        return self._stop.is_set()

    # -- the test's side -------------------------------------------------------------
    def when(self, condition: Callable[[Any], bool], action: Callable[[Any], Any], delay_s: float = 0.0) -> None:
        """``action(learner)`` in the learner's thread ``delay_s`` after ``condition(learner)`` first holds."""
        self.read(lambda _: self._due.append([condition, action, delay_s, None]))

    def publish(self) -> PolicyVersion:
        """Publish its actor now (to every link, and to each later one on its HELLO); the new version."""
        def publish(learner):
            learner.publish()
            return learner.service.version

        return self.read(publish)

    def export(self, path: Path, version: PolicyVersion | None = None) -> Path:
        """The learner's actor as its export (``version``: the learner's current one unless given)."""
        from .learner import export_policy

        runtime.save(path, *self.read(lambda c: export_policy(c.networks, c.state.actor_params, c.config.ddpg,
                                                              c.service.version if version is None else version)))
        return path

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop serving: the service's own shutdown (final ACKs, BYE, close)."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self.error is not None:
            raise self.error

    @property
    def version(self) -> PolicyVersion:
        """The newest weights it published (read after :meth:`close`)."""
        return self.learner.service.version

    def rows(self) -> dict[tuple[int, int], int]:
        """Rows taken per (actor id, device id) of the rows themselves."""
        rows: dict[tuple[int, int], int] = {}
        for t in list(self.taken):
            rows[(t.actor_id, t.device_id)] = rows.get((t.actor_id, t.device_id), 0) + len(t.steps)
        return rows

    def __enter__(self) -> ServedCoupling:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
