"""The learner side of a coupled numerical model, and the experiments' library halves.

* :mod:`.learner`: :class:`CouplingLearner`, a per-level DDPG on the learner service over column steps;
* :mod:`.nwp`: the column "weather model" experiment's rank phases (``examples/nwp_column_correction.py``);
* :mod:`.lorenz96`: the Lorenz-96 experiment (``examples/lorenz96_correction.py``).
"""

from .learner import (
    ColumnNetworks,
    ColumnRing,
    CouplingLearner,
    CouplingLearnerConfig,
    export_policy,
    init,
)

__all__ = ["ColumnNetworks", "ColumnRing", "CouplingLearner", "CouplingLearnerConfig", "export_policy", "init"]
