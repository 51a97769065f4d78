"""Several gradient steps in one jitted call, for any ``update(state, batch) -> (state, metrics)``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

PER_SAMPLE = ("td_error",)
"""Metrics kept per sample (``[K, batch]``) rather than averaged: the learner reads them back
(the TD errors become the sampled rows' priorities)."""


def scanned(update):
    """``update_many(state, batches)``: ``lax.scan`` of ``update`` over the batches'
    leading axis; metrics are averaged over the scanned steps, but for :data:`PER_SAMPLE`."""

    def update_many(state, batches):
        state, metrics = jax.lax.scan(update, state, batches)
        return state, averaged(metrics)

    return update_many


def averaged(metrics: dict) -> dict:
    """``metrics`` of K scanned steps, each averaged but for the per-sample ones."""
    return {name: value if name in PER_SAMPLE else jnp.mean(value) for name, value in metrics.items()}


def sample_weights(batch) -> jax.Array:
    """The batch's per-sample importance weights (``batch["weight"]``, prioritised replay's
    correction), or ones where the replay draws uniformly."""
    return batch["weight"] if "weight" in batch else jnp.ones_like(batch["reward"])
