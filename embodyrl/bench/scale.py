"""``embodyrl bench scale``: one learner's intake as simulated actors are added over a Ray cluster.

For 1, 2, 4, 8 and 16 actors: a real learner (the ``LearnerService`` that ``train`` builds for
the pendulum with DDPG, one gradient step per 100 rows, so that the intake and not the update sets
the pace) in this process, secured with CurveZMQ, and N simulated actors as Ray actors, each
sending pre-made 64-row batches over the real link whenever its credit allows, stamped with the
newest weights it holds (so the learner's policy lag is real). After a warm-up, a window of a
few seconds is measured:

* ``rows_stored_per_s``: rows the replay committed (acknowledged to actors) per second;
* ``learner_cpu_us_per_row``: the learner process's CPU time (every thread: ingest, commits,
  the update, publishing) per row; ``actor_cpu_us_per_row``: the actors' processes' CPU time per
  row sent (encoding, CurveZMQ, the link) summed over actors;
* ``policy_lag``: publications behind the learner's newest weights, of the rows it took;
* ``intake_cpu_us_per_row``: the learner loop thread's CPU on the intake (receive, checks, the
  replay's append, the loop's part of group commits, acks and credits, upkeep) per row stored, and
  ``intake_stage_share``: the learner's CPU by stage, ``other_threads`` being the update's XLA
  threads, the writer, commit and ZeroMQ threads (:mod:`embodyrl.learner.stages`).

The actors and the learner share this machine's cores, so the figures say where one learner's
CPU goes per row, not how far a cluster of many machines scales.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

COUNTS = (1, 2, 4, 8, 16)
UPDATES_PER_STEP = 0.01
"""One gradient step per 100 rows: the intake, not the update, sets the pace."""


def _feeder_class(ray):
    @ray.remote(num_cpus=0)
    class Feeder:
        """A simulated actor: pre-made batches at the rate credit allows, until stopped."""

        def feed(self, endpoint: str, index: int, device: str, obs_msg, action_msg, secret: str, server: str,
                 seconds: float) -> dict:
            import numpy as np

            from ..hal.specs import ArraySpec, DictSpec
            from ..hal.wire.client import LearnerLink
            from ..hal.wire.protocol import DeviceInfo
            from ..hal.wire.security import ClientKeys
            from .algos import ROWS_PER_BATCH, _premade

            obs_spec, action_spec = DictSpec.from_msg(obs_msg), ArraySpec.from_msg(action_msg)
            steps = _premade(obs_spec, action_spec, ROWS_PER_BATCH)
            steps.actor_id[:] = index  # each feeder's own rows: the learner refuses rows of another actor's id
            link = LearnerLink(endpoint, actor_name=f"feeder-{index}", actor_id=index, handshake_timeout_s=300,
                               devices=[DeviceInfo(0, device, obs_spec, action_spec)],
                               keys=ClientKeys(Path(secret), Path(server)))
            link.connect()
            cpu, sent = time.process_time(), 0
            deadline = time.monotonic() + seconds
            try:
                while time.monotonic() < deadline and link.bye_reason is None:
                    if link.credits >= ROWS_PER_BATCH:
                        version = link.held_version
                        steps.policy_incarnation[:] = version.incarnation
                        steps.policy_count[:] = np.maximum(version.count, 0)
                        link.send_steps(0, steps)
                        sent += ROWS_PER_BATCH
                        link.poll(0)
                        link.take_weights()
                    else:
                        link.poll(5)
            finally:
                link.close()
            return {"cpu_s": time.process_time() - cpu, "rows": sent}

    return Feeder


def _measure(ray, feeder_class, actors: int, window_s: float, warm_s: float) -> dict:
    from ..algos import registry
    from ..config import default_config
    from ..hal.wire.security import ServerKeys, generate_keys
    from ..learner import make_learner
    from ..learner.stages import STAGES, shares
    from ..robot import layout_of

    config = dataclasses.replace(default_config("pendulum"), algorithm=registry.DEFAULT, steps=10**12)
    config = dataclasses.replace(config, learner=dataclasses.replace(
        config.learner, updates_per_step=UPDATES_PER_STEP, min_replay=256, log_every_s=3600, checkpoint_every_s=3600))
    (kind,) = layout_of(config).kinds
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _, learner_secret = generate_keys(tmp / "learner", "learner")
        secrets = [generate_keys(tmp / "authorized", f"actor-{i}")[1] for i in range(actors)]
        moved = []
        for secret in secrets:  # only the public halves stay in the authorised directory
            target = tmp / "actors" / secret.name
            target.parent.mkdir(exist_ok=True)
            secret.rename(target)
            moved.append(str(target))
        learner = make_learner(config, tmp / "run", keys=ServerKeys(learner_secret, tmp / "authorized"))
        feeders = [feeder_class.remote() for _ in range(actors)]
        results = [f.feed.remote(learner.endpoint, i, kind.name, kind.observation_spec.to_msg(),
                                 kind.action_spec.to_msg(), moved[i], str(tmp / "learner" / "learner.key"),
                                 warm_s + window_s + 5) for i, f in enumerate(feeders)]
        try:
            learner.publish()
            connect_by = time.monotonic() + 300  # Ray starts the actors' workers; then a warm-up
            learner.serve(lambda: len(learner.server.sessions) >= actors or time.monotonic() > connect_by)
            deadline = time.monotonic() + warm_s
            learner.serve(lambda: time.monotonic() > deadline)
            learner.log()
            rows, cpu, started = learner.counters.rows, time.process_time(), time.monotonic()
            stages = learner.stages.snapshot()
            deadline = started + window_s
            learner.serve(lambda: time.monotonic() > deadline)
            record = learner.log()
            wall = time.monotonic() - started
            stored, learner_cpu = learner.counters.rows - rows, time.process_time() - cpu
            after = learner.stages.snapshot()
            intake_cpu = sum(after[stage] - stages[stage] for stage in STAGES)
            stage_share = shares(stages, after, learner_cpu)
        finally:
            error = learner.shutdown("benchmark done")
        sent = ray.get(results, timeout=600)
        for f in feeders:
            ray.kill(f)
        if error is not None:
            raise error
    actor_rows = sum(s["rows"] for s in sent)
    return {"rows_stored_per_s": round(stored / wall, 1),
            "learner_cpu_us_per_row": round(1e6 * learner_cpu / stored, 1) if stored else None,
            "actor_cpu_us_per_row": round(1e6 * sum(s["cpu_s"] for s in sent) / actor_rows, 1) if actor_rows else None,
            "intake_cpu_us_per_row": round(1e6 * intake_cpu / stored, 1) if stored else None,
            "intake_stage_share": stage_share,
            "policy_lag": record.get("policy_lag"), "updates_per_s": record.get("updates_per_s")}


def run(quick: bool = False) -> dict:
    from ..algos import registry
    from ..cluster.ray_backend import import_ray

    ray = import_ray()
    counts = COUNTS[:3] if quick else COUNTS
    window_s, warm_s = (3.0, 3.0) if quick else (10.0, 5.0)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=2, object_store_memory=80 << 20, include_dashboard=False, log_to_driver=False)
    try:
        feeder_class = _feeder_class(ray)
        by_count = {str(n): _measure(ray, feeder_class, n, window_s, warm_s) for n in counts}
    finally:
        if started_here:
            ray.shutdown()
    one = by_count["1"]["rows_stored_per_s"]
    return {"actors": list(counts), "by_actors": by_count,
            "rows_stored_vs_one_actor": {n: round(r["rows_stored_per_s"] / one, 3) if one else None
                                         for n, r in by_count.items()},
            "window_s": window_s, "batch_rows": 64, "link": "CurveZMQ over loopback",
            "updates_per_step": UPDATES_PER_STEP, "algorithm": registry.DEFAULT, "task": "pendulum"}
