"""Several gradient steps in one jitted call, for any ``update(state, batch) -> (state, metrics)``."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def scanned(update):
    """``update_many(state, batches)``: ``lax.scan`` of ``update`` over the batches'
    leading axis; metrics are averaged over the scanned steps."""

    def update_many(state, batches):
        state, metrics = jax.lax.scan(update, state, batches)
        return state, jax.tree.map(jnp.mean, metrics)

    return update_many
