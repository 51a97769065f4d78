"""A coupled numerical model's side: rank-local tensors in, bounded corrections out.

* :mod:`.link`: :class:`CouplingLink`, what every MPI rank of the model calls each step;
* :mod:`.batch`: the streamed rows of many exchanges gathered straight into one batch;
* :mod:`.inference`: a nearby inference process answering the ranks' corrections;
* :mod:`.clib`: the same link for C and Fortran models (``c/``, libembodyrl_link), built with CMake.
"""

from .link import (
    CouplingConfig,
    CouplingError,
    CouplingLink,
    CouplingStats,
    io_threads_cpu_s,
    level_inputs,
)

__all__ = ["CouplingConfig", "CouplingError", "CouplingLink", "CouplingStats", "io_threads_cpu_s", "level_inputs"]
