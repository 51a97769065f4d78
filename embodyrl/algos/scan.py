"""Several gradient steps in one jitted call, for any ``update(state, batch) -> (state, metrics)``,
each step kept only if it stayed finite (written here once, for every algorithm)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

PER_SAMPLE = ("td_error",)
"""Metrics kept per sample (``[K, batch]``) rather than averaged: the learner reads them back
(the TD errors become the sampled rows' priorities)."""
SKIPPED = "nonfinite_skipped"
"""The metric that counts the steps :func:`keep_finite` skipped (summed over a call's steps)."""


def keep_finite(update):
    """``update``, but a step whose losses (the metrics named ``*loss``) or new state are not all
    finite leaves the whole state as it was (parameters, optimiser states, targets, step counter,
    RNG key), and says so in ``metrics["nonfinite_skipped"]`` (1.0, else 0.0).

    A finite but absurd batch (a reward of 3e38) makes a squared TD error infinite; one such step
    would leave every later loss infinite. The test is one reduction over the losses and the new
    state, and the choice one ``lax.cond`` between two states already computed."""

    def guarded(state, batch):
        new_state, metrics = update(state, batch)
        checked = [v for k, v in metrics.items() if k.endswith("loss")]
        checked += [x for x in jax.tree.leaves(new_state) if jnp.issubdtype(x.dtype, jnp.inexact)]
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in checked])) if checked else jnp.bool_(True)
        state = jax.lax.cond(finite, lambda pair: pair[0], lambda pair: pair[1], (new_state, state))
        return state, {**metrics, SKIPPED: 1.0 - finite.astype(jnp.float32)}

    return guarded


def scanned(update):
    """``update_many(state, batches)``: ``lax.scan`` of ``update`` (under :func:`keep_finite`) over
    the batches' leading axis; metrics are averaged over the steps taken, but for :data:`PER_SAMPLE`
    and the count of skipped steps."""

    def update_many(state, batches):
        state, metrics = jax.lax.scan(keep_finite(update), state, batches)
        return state, averaged(metrics)

    return update_many


def averaged(metrics: dict) -> dict:
    """``metrics`` of K scanned steps, each averaged over the steps :func:`keep_finite` kept (over all
    K when it kept none), but for the per-sample ones (non-finite TD errors read as 0: no priority)
    and :data:`SKIPPED`, summed."""
    kept = 1.0 - metrics[SKIPPED] if SKIPPED in metrics else None
    out = {}
    for name, value in metrics.items():
        if name in PER_SAMPLE:
            out[name] = jnp.where(jnp.isfinite(value), value, 0.0)
        elif name == SKIPPED:
            out[name] = jnp.sum(value)
        elif kept is None:
            out[name] = jnp.mean(value)
        else:
            rows = value.reshape(value.shape[0], -1)
            taken = jnp.broadcast_to(kept[:, None] > 0, rows.shape)
            count = jnp.sum(taken)
            mean = jnp.sum(jnp.where(taken, rows, 0.0)) / jnp.maximum(count, 1)
            out[name] = jnp.where(count > 0, mean, jnp.mean(rows))
    return out


def sample_weights(batch) -> jax.Array:
    """The batch's per-sample importance weights (``batch["weight"]``, prioritised replay's
    correction), or ones where the replay draws uniformly."""
    return batch["weight"] if "weight" in batch else jnp.ones_like(batch["reward"])
