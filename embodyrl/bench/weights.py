"""``embodyrl bench weights``: the bytes a weight publication costs in a real training run.

A real DDPG (or SAC) run on the pendulum: the task's tuned configuration,
its networks built as the learner builds them (:meth:`Training.of
<embodyrl.learner.service.Training.of>`), the real jitted ``update_many``
fed K stacked batches from a persistent replay that holds a real rollout of
the MuJoCo pendulum under random actions. Weights are published as the
learner publishes them: once at the start, then whenever the update count
crosses a multiple of ``publish_every`` (the :class:`~embodyrl.config.LearnerConfig`
default). Each publication goes to a real :class:`~embodyrl.transport.publisher.WeightPublisher`
per mode and is encoded for an actor that holds the previous publication
(it kept up); the frames that would go on the wire are counted, header
included, and each ``auto`` update is decoded and rebuilt against that base
and checked bit for bit. The initial publication (full weights to an actor
that holds none) is left out: every figure is per later publication.

* ``changed_fraction_mean`` / ``_min`` / ``_max``: fraction of the
  published parameters whose bits changed since the previous publication
  (what a lossless delta must carry). Adam moves nearly every weight every
  step, so this is near 1, not the 1% that ``sparse_1pct_size_ratio`` in
  ``embodyrl bench transport`` assumes.
* ``weights_fp32_bytes_per_publish``: the baseline, full fp32 weights.
* ``weights_auto_bytes_per_publish``: mean bytes ``auto`` (the learner's
  default) sent; ``auto_encodings`` counts what it chose. ``auto`` picks
  full or a lossless delta only, never ``bf16``/``int8``.
* ``weights_bytes_per_publish_ratio_vs_fp32``: fp32 bytes over auto's bytes.
  Every ``*_ratio_vs_fp32`` here is (fp32 bytes) / (that mode's bytes):
  **above 1 means that mode sends fewer bytes than full fp32**; 1 means no
  saving, below 1 more bytes.
* ``weights_bf16_*``, ``weights_int8_*``, ``weights_delta_*``: the same for
  the pinned encodings of :class:`~embodyrl.transport.publisher.WeightsConfig`:
  bf16 and int8 are lossy (int8: one scale per tensor), ``delta`` is
  lossless whatever its size. A learner built from a training config
  always runs ``auto``: no config setting reaches the server's ``weights``.
* ``publications_per_s``, ``*_kbit_per_s``: what this means on a thin link.
  At ``updates_per_step`` gradient steps per environment step, one actor at
  the pendulum's control rate makes ``control_hz * updates_per_step /
  publish_every`` publications a second; each mode's kbit/s is its bytes
  per publication times that, per actor. (The learner sends the newest
  weights only once an actor holds the last ones it was sent, so a link
  slower than this does not queue weights: the actor acts on older ones.)
* ``fanout``: the learner's egress per publication and each actor's latency, for 1, 4 and 16
  actors linked directly and through one relay (:mod:`.fanout`).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import Counter
from pathlib import Path

import jax
import numpy as np

from ..algos import registry
from ..algos.heads import over
from ..config import LearnerConfig, default_config
from ..hal.steps import PolicyVersion, StepRecorder
from ..hal.wire import weights as W
from ..hal.wire.codec import decode
from ..learner.service import Training
from ..replay import PersistentReplay
from ..transport.publisher import WeightPublisher, WeightsConfig

TASK = "pendulum"
MODES = ("auto", W.FULL, W.DELTA, W.BF16, W.INT8)
_INCARNATION = 1


def _frame_bytes(frames: list) -> int:
    """Bytes of a message's frames (header included) as they go on the wire."""
    return sum(memoryview(f).nbytes for f in frames)


def _rollout(device, task, replay: PersistentReplay, steps: int, seed: int) -> None:
    """``steps`` control steps of the device under uniform random actions, into ``replay``."""
    rng = np.random.default_rng(seed)
    spec = device.action_spec
    rec = StepRecorder(device.observation_spec, spec, actor_id=0, device_id=0,
                       capacity=task.max_episode_steps + 2)
    version = PolicyVersion(_INCARNATION, 0)
    done, episode = 0, 0
    device.connect()
    try:
        while done < steps:
            obs = device.reset(seed + episode)
            for t in range(task.max_episode_steps):
                action = rng.uniform(spec.minimum, spec.maximum, spec.shape).astype(spec.dtype)
                nxt = device.step(action)
                last = t == task.max_episode_steps - 1
                rec.add(obs, action, action, task.reward(obs, action, nxt), False, last, version)
                obs = nxt
            rec.add_final(obs)
            replay.add(rec.flush())
            done += task.max_episode_steps
            episode += 1
    finally:
        device.close()
    replay.commit()


def measure(*, updates: int, rollout_steps: int, hidden_sizes: tuple[int, ...] | None = None,
            learning_rate: float | None = None, algorithm: str = registry.DEFAULT, seed: int = 0) -> dict:
    """Train ``updates`` real gradient steps, publishing as the learner does; the per-publication figures.

    ``hidden_sizes``: the networks' widths (None: the algorithm's default). ``learning_rate``: every
    ``*_lr`` of the algorithm's section (None: its defaults; 0 freezes the weights).
    """
    from ..envs import layout as task_layout
    from ..envs import make

    lc = LearnerConfig()
    config = default_config(TASK)
    section_name = registry.get(algorithm).section
    section = getattr(config, section_name)
    changes = {}
    if hidden_sizes is not None:
        changes["hidden_sizes"] = tuple(hidden_sizes)
    if learning_rate is not None:
        changes.update({f.name: float(learning_rate) for f in dataclasses.fields(section)
                        if f.name.endswith("_lr")})
    config = dataclasses.replace(config, algorithm=algorithm, learner=lc,
                                 **{section_name: dataclasses.replace(section, **changes)})
    device, task = make(TASK)
    layout = task_layout(TASK)
    algo = over(config.algo, layout)
    training = Training.of(algo, layout.observation_spec, layout.action_spec, config.seed,
                           updates_per_call=lc.updates_per_call, publish_every=lc.publish_every)
    publishers = {m: WeightPublisher(WeightsConfig(encoding=m)) for m in MODES}
    sent: dict[str, list[int]] = {m: [] for m in MODES}
    changed: list[float] = []
    chosen: Counter = Counter()
    count = 0

    def publish() -> None:
        nonlocal count
        count += 1
        weights = training.actor_weights()
        version, held = PolicyVersion(_INCARNATION, count), PolicyVersion(_INCARNATION, count - 1)
        previous = publishers["auto"].current if count > 1 else None
        for mode, publisher in publishers.items():
            publisher.publish(version, weights)
            if count == 1:
                continue  # the first weights go in full to an actor that holds none: not a per-publication cost
            update = publisher.update_for(held, None)
            sent[mode].append(_frame_bytes(update.frames))
            if mode == "auto":
                chosen[update.encoding] += 1
                _check(update, previous, weights)
        if previous is not None:
            changed.append(W.density(previous, weights))

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        replay = PersistentReplay(Path(tmp) / "replay", layout.observation_spec, layout.action_spec,
                                  capacity=(rollout_steps // 1024 + 2) * 1024, chunk_rows=1024)
        try:
            _rollout(device, task, replay, rollout_steps, seed)

            def batch():
                batches = [replay.sample(rng, algo.batch_size, algo.discount, lc.n_step)
                           for _ in range(lc.updates_per_call)]
                return jax.tree.map(lambda *xs: np.stack(xs), *batches)

            publish()  # as the learner does before it serves
            done = 0
            while done < updates:
                training.update(batch())
                before, done = done, done + lc.updates_per_call
                if done // lc.publish_every > before // lc.publish_every:
                    publish()
        finally:
            replay.close()

    fp32 = float(np.mean(sent[W.FULL]))
    means = {m: float(np.mean(sent[m])) for m in MODES}
    per_s = (1.0 / device.control_period_s) * lc.updates_per_step / lc.publish_every
    out = {
        "algorithm": algorithm,
        "updates": done,
        "publications": len(changed),
        "publish_every": lc.publish_every,
        "updates_per_call": lc.updates_per_call,
        "hidden_sizes": list(config.algo.config.hidden_sizes),
        "actor_parameters": int(sum(v.size for v in publishers["auto"].current.values())),
        "learning_rate": learning_rate,
        "rollout_steps": rollout_steps,
        "changed_fraction_mean": round(float(np.mean(changed)), 4),
        "changed_fraction_min": round(float(np.min(changed)), 4),
        "changed_fraction_max": round(float(np.max(changed)), 4),
        "weights_fp32_bytes_per_publish": round(fp32),
        "weights_auto_bytes_per_publish": round(means["auto"]),
        "weights_bytes_per_publish_ratio_vs_fp32": round(fp32 / means["auto"], 3),
        "auto_encodings": dict(sorted(chosen.items())),
    }
    for mode in (W.DELTA, W.BF16, W.INT8):
        out[f"weights_{mode}_bytes_per_publish"] = round(means[mode])
        out[f"weights_{mode}_ratio_vs_fp32"] = round(fp32 / means[mode], 3)
    out["control_hz"] = round(1.0 / device.control_period_s, 3)
    out["publications_per_s"] = round(per_s, 4)
    for mode, name in (("auto", "auto"), (W.FULL, "fp32"), (W.BF16, "bf16"), (W.INT8, "int8")):
        out[f"weights_{name}_kbit_per_s"] = round(means[mode] * 8 * per_s / 1e3, 1)
    return out


def _check(update, base: dict, weights: dict) -> None:
    """Decode ``update`` as an actor holding ``base`` would; it must rebuild ``weights`` bit for bit."""
    msg = decode(update.frames)
    if update.encoding == W.DELTA:
        rebuilt = W.apply_delta(base, msg.arrays)
    elif update.encoding == W.FULL:
        rebuilt = dict(msg.arrays)
    else:
        raise AssertionError(f"auto sent {update.encoding}, a lossy encoding it never picks")
    if W.checksum(rebuilt) != W.checksum(weights) or msg.fields["checksum"] != W.checksum(weights):
        raise AssertionError(f"auto's {update.encoding} update does not rebuild the published weights")


def run(quick: bool = False, *, learning_rate: float | None = None, fan_out: bool = True) -> dict:
    """The figures of one run; ``learning_rate`` overrides the algorithm's (tests: 0 vs default);
    ``fan_out``: also the learner's egress and the actors' latency, direct and through a relay
    (:mod:`.fanout`, under ``fanout``)."""
    if quick:
        result = measure(updates=384, rollout_steps=1000, hidden_sizes=(32, 32), learning_rate=learning_rate)
    else:
        result = measure(updates=4096, rollout_steps=10_000, learning_rate=learning_rate)
    result["note"] = _note(result)
    if fan_out:
        from .fanout import run as fanout

        result["fanout"] = fanout(quick)
    return result


def _note(r: dict) -> str:
    """What the figures mean for one actor on a thin link."""
    rate = (f"One actor at {r['control_hz']:g} Hz control and learner.updates_per_step "
            f"{LearnerConfig().updates_per_step:g} gets {r['publications_per_s']:g} publications/s: auto "
            f"costs {r['weights_auto_kbit_per_s']:g} kbit/s per actor (full fp32 "
            f"{r['weights_fp32_kbit_per_s']:g}, pinned bf16 {r['weights_bf16_kbit_per_s']:g}, int8 "
            f"{r['weights_int8_kbit_per_s']:g}). ")
    dense = r["changed_fraction_mean"] > 0.5
    why = (f"{r['changed_fraction_mean']:.0%} of the weights change between publications (Adam moves "
           "nearly all of them), so a lossless delta saves nothing and auto sends full fp32. " if dense else
           f"Only {r['changed_fraction_mean']:.1%} of the weights change between publications, so auto's "
           "deltas are small. ")
    return (rate + why + "On a slower link raise learner.publish_every, or pin bf16 (half) or int8 (a "
            "quarter; both lossy) with learner.weights_encoding. Ratios are fp32 bytes over the mode's "
            "bytes: above 1, fewer bytes than fp32.")
