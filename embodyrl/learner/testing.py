"""The real learner service on a loopback port, in a thread: what a test drives an actor, a link, a
robot or a coupled rank against, instead of a second implementation of the learner's loop.

::

    with ServedLearner(tmp_path, envs.layout("pendulum"), run_id="r", incarnation=3) as learner:
        link = LearnerLink(learner.endpoint, ...)
        ...                                  # the actor's side, as in a run
        learner.wait(lambda service: service.counters.rows >= 70)
    learner.taken                            # every batch the service took, in order

Everything between the socket and the disk is the service's own: :class:`LearnerServer`
(handshake, identity, limits), :meth:`LearnerService.serve` (ingest, dedupe, durable commit,
cumulative ACKs, credits, heartbeats, publication) and :class:`ReplayData` over a persistent
replay in the test's directory, admitting the devices that fit ``layout`` (several kinds are
padded into its row layout, as in a run). Without a ``training`` it never trains: ``learner.min_replay``
is set past any test's rows, so the rate limiter grants credit freely and no JAX math runs;
it publishes ``weights`` if given, else nothing (an actor that must never load weights can
say so). With a ``training`` (and, for an on-policy learner, its ``data`` side, e.g. PPO's
:class:`~embodyrl.learner.rollout_side.RolloutData`) it compiles the update before serving and
trains as a run does; :meth:`pause_training` holds it as the operator console's pause does.
:meth:`kill`, or ``dies_on(batch)`` as a batch arrives, ends it without a goodbye, as a
SIGKILL would: nothing more is committed or acknowledged.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..config import LearnerConfig
from ..hal.layout import Layout
from ..hal.steps import Steps
from ..transport import LearnerServer
from .build import admission
from .replay_side import ReplayData
from .service import LearnerService

NEVER = 1 << 40
"""``learner.min_replay`` of a learner that never trains: more rows than any test sends."""
SMALL_REPLAY = LearnerConfig(replay_capacity=1 << 16, replay_chunk_rows=1024, replay_ram_budget_mb=64)


class BetweenTurns:
    """Questions a test asks of a service whose state only the service's own thread may touch,
    answered in that thread between two of its turns (:meth:`_answer`, called from its ``stop``)."""

    def __init__(self):
        self._asked: list[tuple[Callable, threading.Event, list]] = []
        self._lock = threading.Lock()

    def _answer(self, subject: Any) -> None:
        """In the service's thread: answer every question asked since the last turn."""
        with self._lock:
            asked, self._asked = self._asked, []
        for question, answered, answer in asked:
            try:
                answer.append(question(subject))
            except BaseException as err:  # noqa: BLE001 - handed back to the asking thread
                answer.append(err)
            answered.set()

    def read(self, question: Callable[[Any], Any], timeout_s: float = 10.0) -> Any:
        """``question(subject)`` answered in the service's own thread, between two turns."""
        answered, answer = threading.Event(), []
        with self._lock:
            self._asked.append((question, answered, answer))
        if not answered.wait(timeout_s):
            raise TimeoutError(f"the learner did not answer within {timeout_s} s")
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return answer[0]

    def wait(self, question: Callable[[Any], Any], timeout_s: float = 20.0) -> bool:
        """Whether ``question(subject)`` (asked as :meth:`read` asks it) came true within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.read(question):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


class _Killed(Exception):
    """Raised between two turns to end the service where it stands."""


class Taken(NamedTuple):
    """One batch as the service's data side took it."""

    steps: Steps
    seq: int
    actor_id: int

    @property
    def device_id(self) -> int:
        return int(self.steps.device_id[0])


class NoTraining:
    """The training half of a learner that only ingests: the same face as
    :class:`~embodyrl.learner.service.Training`, publishing ``weights`` unchanged."""

    name = "none"
    updates_per_call = 1
    publish_every = 1

    def __init__(self, weights: dict[str, np.ndarray] | None = None):
        self.weights = dict(weights or {})
        self.state: Any = None

    def actor_weights(self) -> dict[str, np.ndarray]:
        return dict(self.weights)

    def update(self, batch) -> dict:  # never called: the data side is never trainable
        raise AssertionError("a learner without training was asked to train")


class _Recorded:
    """The data side as it is, keeping each batch it takes for the test to read; ``dies_on(batch)``:
    the learner dies as that batch arrives (it is never stored, committed or acknowledged)."""

    def __init__(self, data, taken: list[Taken], dies_on: Callable[[Taken], bool] | None, died: threading.Event):
        self._data, self._taken, self._dies_on, self._died = data, taken, dies_on, died

    def add(self, steps: Steps, seq: int, actor_id: int) -> int:
        batch = Taken(steps, seq, actor_id)
        if self._dies_on is not None and self._dies_on(batch):
            self._died.set()
            raise _Killed
        self._taken.append(batch)
        return self._data.add(steps, seq, actor_id)

    def __getattr__(self, name):
        return getattr(self._data, name)


class ServedLearner(BetweenTurns):
    """A :class:`LearnerService` serving on loopback in a daemon thread until :meth:`close`.

    ``server_options`` go to :class:`LearnerServer` (``run_id``, ``incarnation``, ``keys``,
    ``peer_timeout_s``, ``duplicate_window_s``, ``admit`` (default: the layout's), ...);
    ``endpoint`` defaults to a free loopback port. ``learner``: the replay's settings (its
    ``min_replay`` is raised to :data:`NEVER` without a ``training``). ``training``: a real
    :class:`~embodyrl.learner.service.Training` for a test that needs updates, compiled (the
    service's ``warm_up``) before the service serves, as :func:`~embodyrl.learner.build.build_learner`
    does. ``data``: the data side to serve instead of the replay (``learner``, ``batch_size`` and
    ``discount`` are then unused), e.g. :class:`~embodyrl.learner.rollout_side.RolloutData` made for
    the server's ``incarnation``, with its ``training``; it keeps no committed seq across restarts.
    """

    def __init__(self, directory: Path, layout: Layout, *, training=None, data=None,
                 weights: dict[str, np.ndarray] | None = None, learner: LearnerConfig = SMALL_REPLAY,
                 batch_size: int = 32, discount: float = 0.99, endpoint: str = "tcp://127.0.0.1:*",
                 dies_on: Callable[[Taken], bool] | None = None, **server_options):
        if training is None:
            learner = dataclasses.replace(learner, min_replay=NEVER)
        self.taken: list[Taken] = []
        if data is None:
            data = ReplayData(Path(directory) / "replay", layout.observation_spec, layout.action_spec,
                              learner, batch_size=batch_size, discount=discount, seed=0, pad=layout.pad_steps)
            server_options.setdefault("committed_seq", data.committed_seq)  # a restart resumes each actor
        self.data = data
        server_options.setdefault("admit", admission(layout))
        try:
            self.server = LearnerServer(endpoint, **server_options)
        except BaseException:
            self.data.close(failed=False)
            raise
        self._stop, self._killed = threading.Event(), threading.Event()
        self._restart = False
        self.service = LearnerService(self.server, _Recorded(self.data, self.taken, dies_on, self._killed),
                                      training or NoTraining(weights),
                                      incarnation=self.server.incarnation, log_every_s=3600.0)
        if training is not None:
            try:  # before serving, as a run compiles before actors depend on its answers
                self.service.warm_up()
            except BaseException:
                self.server.close()
                self.data.close(failed=False)
                raise
        self._publishes = training is not None or weights is not None
        BetweenTurns.__init__(self)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="served-learner", daemon=True)
        self._thread.start()

    # -- the service's thread ------------------------------------------------------
    def _run(self) -> None:
        """:meth:`LearnerService.run`, less its first publication when there is nothing to publish."""
        try:
            if self._publishes:
                self.service.publish()
            try:
                self.service.serve(self._turn)
            except _Killed:  # no commit, no goodbye: the sockets and files just close
                self.server.close()
                self.data.close(failed=True)  # as a crash: what the writer has not committed is gone
                return
            error = self.service.shutdown("the test is over", restart=self._restart)
            if error is not None:
                raise error
        except BaseException as err:  # noqa: BLE001 - kept for the test, raised by close()
            self.error = err

    def _turn(self) -> bool:
        """Between two of the service's turns: answer the test's questions; stop when asked."""
        self._answer(self.service)
        if self._killed.is_set():
            raise _Killed
        return self._stop.is_set()

    # -- the test's side -------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def died(self) -> bool:
        """Whether it was killed (:meth:`kill`, or ``dies_on``)."""
        return self._killed.is_set()

    @property
    def rows(self) -> int:
        """Rows taken so far (resends not counted)."""
        return sum(len(t.steps) for t in self.taken)

    def pause_training(self, paused: bool = True) -> None:
        """Pause (or, ``paused=False``, resume) training as the operator console's command does, in
        the service's thread: ingest, ACKs and credit go on; no update, so no new weights."""
        self.read(lambda service: setattr(service, "training_paused", paused))

    def rejected(self, reason: str) -> int:
        """How many messages the server refused for ``reason``."""
        return self.read(lambda service: service.server.stats.rejected.get(reason, 0))

    def close(self, timeout_s: float = 10.0, restart: bool = False) -> None:
        """Stop serving: the service's own shutdown (final commit and ACKs, BYE, close); a no-op
        after :meth:`kill`. ``restart``: the BYE says the run goes on (a learner stopped before its
        budget, to be started again)."""
        self._restart = restart
        self._stop.set()
        self._thread.join(timeout_s)
        if self.error is not None:
            raise self.error

    def kill(self, timeout_s: float = 10.0) -> None:
        """End the service without its shutdown: no final commit, ACK or BYE (a learner that died)."""
        self._killed.set()
        self._thread.join(timeout_s)

    def __enter__(self) -> ServedLearner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
