"""embodyrl: online RL on real robots and scientific simulators.

Kept light on purpose: ``import embodyrl.hal`` must not pull in JAX.
"""

__version__ = "0.1.0"
