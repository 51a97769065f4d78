"""The wire: one codec and protocol for both ends, and the actor-side client.

``codec`` frames and checks every message; ``protocol`` is the actor <-> learner conversation and
``client`` its actor side; ``robot`` is the robot server's conversation (server and client share it);
``security`` the CurveZMQ keys and the key options both ends take; ``spool``, ``weights`` and
``compression`` what an actor keeps, receives and squeezes; ``control`` the console's conversation.
"""

from .codec import PROTOCOL_VERSION, Limits, Message, MessageError, decode, encode

__all__ = ["PROTOCOL_VERSION", "Limits", "Message", "MessageError", "decode", "encode"]
