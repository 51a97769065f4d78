"""The learner: one service loop (:mod:`.service`) over a data side that varies.

* :mod:`.service`: :class:`LearnerService`, the loop, its :class:`Counters`, the :class:`Training` half;
* :mod:`.replay_side`: off-policy rows in the persistent replay, batches within a rate limit;
* :mod:`.rollout_side`: PPO's rollout segments, synchronous or asynchronous;
* :mod:`.metrics`: ``metrics.jsonl`` and TensorBoard;
* :mod:`.build`: a service assembled from a :class:`~embodyrl.config.TrainConfig`.

A coupled model's learner (:mod:`embodyrl.coupling`) runs on the same service with a RAM ring.
"""

from .build import build_learner, make_learner
from .service import Counters, DataSide, LearnerService, Training

__all__ = ["Counters", "DataSide", "LearnerService", "Training", "build_learner", "make_learner"]
