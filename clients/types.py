"""Plain data types of the client SDK (transport-independent).

They are the wire types of `visenv.wire`, which the server uses too: `Image`
(`.to_array()`, `.to_pil()`), `Observation`, `RewardParts`, `EnvSpec`, `SessionOptions`,
`ActionSpec`. `SessionReply` adds the address of the server that answered it.
"""

from __future__ import annotations

from dataclasses import dataclass

from visenv import wire
from visenv.wire import ActionSpec, EnvSpec, Image, Observation, RewardParts, SessionOptions


@dataclass
class SessionReply(wire.SessionReply):
    """A server's answer for one session: the observation and, after a step, the reward.

    `server` is the address of the server that holds the session (set by the client).
    """

    server: str = ""


__all__ = [
    "ActionSpec",
    "EnvSpec",
    "Image",
    "Observation",
    "RewardParts",
    "SessionOptions",
    "SessionReply",
]
