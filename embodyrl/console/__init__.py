"""The operator console: one page to watch every robot and the learner, and to act on them.

* :mod:`.state`: what the console knows (peers, frames, curves, actions);
* :mod:`.identity`: who may speak as which peer (ids bound to keys, or to live connections);
* :mod:`.control`: the control endpoint that peers dial, and the actions sent through it;
* :mod:`.admin`: the admin key, and the robot servers it sends e-stops and clears to;
* :mod:`.app`: the web face (the page, a WebSocket of the state, frames, actions);
* :mod:`.server`: both in one event loop (``embodyrl console``).

The peer side is :mod:`embodyrl.hal.console` (the link) and
:mod:`embodyrl.hal.actor_console` (what an actor does with the commands).
"""
