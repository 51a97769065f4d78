"""Where an engine places the learner and the actors of one run, and how they find each other.

* :mod:`.rendezvous`: the run's record (a directory, or Ray's key-value store): the learner's
  endpoint and key, the actors' public keys;
* :mod:`.roles`: the learner and an actor joined through that record (``--rendezvous``);
* :mod:`.ray_backend`, :mod:`.slurm_backend`: ``embodyrl launch ray`` and ``launch slurm``.

Nothing is imported here: ``embodyrl.cluster`` is a folder of modules, each imported where it is used.
"""
