"""The command line and what it runs on this machine.

* :mod:`.commands`: ``embodyrl`` and its subcommands (parsing, config resolution, exit codes);
* :mod:`.security`: CurveZMQ key options and address checks;
* :mod:`.launch`: ``embodyrl train``, a learner and actor processes on this machine;
* :mod:`.processes`: the learner's and the actors' process entry points;
* :mod:`.display`: progress from ``metrics.jsonl``; :mod:`.plot`: learning curves;
* :mod:`.evaluate`: a saved policy against random actions; :mod:`.export`: to the numpy runtime;
* :mod:`.replay_report`: what a replay directory holds (``embodyrl replay``).
"""

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
