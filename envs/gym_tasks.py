"""Gymnasium's MuJoCo benchmarks as registered tasks, through the Gymnasium adapter.

``halfcheetah`` is ``HalfCheetah-v5`` (17-D state, 6-D torque in [-1, 1],
1000-step time limit, never terminates): the task the TD3 and SAC papers
report learning curves for, so our runs can be set beside theirs. The
device and the task come from :mod:`embodyrl.hal.drivers.gymnasium`, so the
env's own reward, termination and time limit reach the actor loop unchanged.
"""

from __future__ import annotations

HALFCHEETAH_ID = "HalfCheetah-v5"


def make_halfcheetah(**kwargs):
    """(device, task) for Gymnasium's ``HalfCheetah-v5``; ``kwargs`` go to ``gymnasium.make``."""
    from ..hal.drivers.gymnasium import make

    return make(HALFCHEETAH_ID, **kwargs)
