"""How learners that agree by consensus talk to each other, without knowing any socket.

A distributed algorithm (:mod:`.vrdq.distributed`, :mod:`.dqn.distributed`)
takes an :data:`Exchange`: a function that sends this round's arrays to the
out-neighbours and returns what the expected in-neighbours sent for the same
round. The runner plugs one in (over peer links:
:meth:`embodyrl.transport.peers.PeerLink.exchange_fn`, wired by
:mod:`embodyrl.learner.consensus`), so the algorithms stay pure of the
transport and a test can plug in an in-memory one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Arrays = dict[str, np.ndarray]

Exchange = Callable[[int, Arrays, set[int]], dict[int, Arrays]]
"""``exchange(round, arrays, neighbours) -> {neighbour: arrays}``: send, then receive this round's;
a neighbour missing at the exchange's deadline is left out of the answer."""

Traffic = Callable[[], dict[str, int]]
"""``traffic() -> {"messages_out": n, "bytes_out": n}``: what the exchange has sent so far."""


def no_traffic() -> dict[str, int]:
    return {"messages_out": 0, "bytes_out": 0}
