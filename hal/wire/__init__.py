"""The wire: one codec and protocol for both ends, and the actor-side client."""

from .codec import PROTOCOL_VERSION, Limits, Message, MessageError, decode, encode

__all__ = ["PROTOCOL_VERSION", "Limits", "Message", "MessageError", "decode", "encode"]
