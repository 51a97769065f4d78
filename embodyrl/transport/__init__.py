"""The learner's side of the wire."""

from .server import ActorSession, LearnerServer, ReceivedSteps

__all__ = ["ActorSession", "LearnerServer", "ReceivedSteps"]
