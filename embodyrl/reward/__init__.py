"""A learnt success reward: a binary classifier of camera frames, trained on demonstrations.

HIL-SERL (Luo et al. 2024) replaces a hand-written success check with a
classifier of camera frames, trained on frames a person labelled, and pays
1 when it says success. Here the labels come from recorded demonstrations
(``embodyrl record``, one labelled episode per file), and the classifier
runs at the edge through the numpy runtime:

* ``dataset.py``: demonstration directories to labelled frames (the last k
  observations of a successful episode are positive, every other one
  negative) and a split by episode;
* ``model.py``: the CNN (3x3 VALID convolutions, ReLU, dense layers, one logit);
* ``train.py``: balanced batches, random-shift and brightness augmentation,
  Adam on the binary cross-entropy; held-out precision and recall;
* ``export.py``: the trained model as ``classifier.json`` + ``classifier.npz``,
  read by :mod:`embodyrl.hal.classifier` without JAX.

``embodyrl reward train`` (:mod:`embodyrl.cli.reward`) runs the four; a robot
file pays the classifier's verdict with ``task.reward: classifier:DIR``.
"""
