"""Replay of the step stream."""

from .memory import StepReplay

__all__ = ["StepReplay"]
