"""Learning algorithms as pure functions over state pytrees (JAX)."""
