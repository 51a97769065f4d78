"""Learners that agree by consensus, run with peer links plugged in.

The distributed algorithms (:mod:`embodyrl.algos.vrdq.distributed`,
:mod:`embodyrl.algos.dqn.distributed`) know no sockets: they take an
exchange function. Here each learner or agent gets a
:class:`~embodyrl.transport.peers.PeerLink` bound at its endpoint and dialled
to its neighbours in W, handed in as that function. The neural distributed
DQN steps its own environments (it has no actors), so it runs beside the
learner service, not on it.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from contextlib import contextmanager

import numpy as np

from ..algos.dqn.config import DQNConfig
from ..algos.dqn.distributed import RunConfig, run_learner
from ..algos.vrdq import distributed as vrdq_distributed
from ..algos.vrdq.learning import VRDQConfig
from ..transport.peers import PeerLink


@contextmanager
def peer_link(index: int, W: np.ndarray, endpoints: dict[int, str]):
    """Learner ``index``'s link: bound at its endpoint, dialled to its out-neighbours in ``W``."""
    link = PeerLink(index, bind=endpoints[index])
    try:
        link.connect({int(j): endpoints[int(j)] for j in np.flatnonzero(W[index]) if j != index})
        yield link
    finally:
        link.close()


def loopback_endpoints(n: int) -> dict[int, str]:
    """``n`` free loopback ports, one for each learner to bind."""
    endpoints = {}
    for i in range(n):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            endpoints[i] = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    return endpoints


def run_agent(agent: int, W: np.ndarray, endpoints: dict[int, str], mdp, config: VRDQConfig, budget: int,
              seed: int, round_timeout_s: float = 30.0) -> tuple[np.ndarray, dict]:
    """One VRDQ agent over peer links, ``budget`` samples per (s, a); returns (its Q, what its link sent)."""
    with peer_link(agent, W, endpoints) as link:
        return vrdq_distributed.run_agent(agent, W, link.exchange_fn(round_timeout_s), mdp, config, budget, seed,
                                          link.traffic)


def _dqn_learner(index: int, W: np.ndarray, endpoints: dict[int, str], dqn: DQNConfig, run: RunConfig) -> dict:
    if W.shape[0] == 1:
        return run_learner(index, W, dqn, run)
    with peer_link(index, W, endpoints) as link:
        return run_learner(index, W, dqn, run, link.exchange_fn(run.round_timeout_s), link.traffic)


def _learner_process(index, W, endpoints, dqn, run, queue) -> None:
    try:
        queue.put(("done", _dqn_learner(index, W, endpoints, dqn, run)))
    except BaseException as err:  # the parent reports it; never hang it
        queue.put(("error", f"learner {index}: {type(err).__name__}: {err}"))
        raise


def run_team(n: int, dqn: DQNConfig, run: RunConfig, topology: str = "complete",
             timeout_s: float = 3600.0) -> list[dict]:
    """``n`` distributed DQN learners as spawned processes on loopback peer links; their histories."""
    from ..algos.vrdq.graphs import adjacency, metropolis

    W = np.ones((1, 1)) if n == 1 else metropolis(adjacency(topology, n, np.random.default_rng(run.seed)))
    endpoints = loopback_endpoints(n)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_learner_process, args=(i, W, endpoints, dqn, run, queue), name=f"dqn-learner-{i}")
             for i in range(n)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + timeout_s
    try:
        while len(results) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"distributed DQN: {n - len(results)} learners unfinished after {timeout_s} s")
            try:
                kind, payload = queue.get(timeout=min(remaining, 5.0))
            except Exception:  # queue.Empty: check the children are alive
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"distributed DQN: {dead[0]} died") from None
                continue
            if kind == "error":
                raise RuntimeError(payload)
            results[payload["index"]] = payload
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
    return [results[i] for i in range(n)]
