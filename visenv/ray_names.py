"""How a set of visenv servers on a Ray cluster is named: the contract between the actors
that serve it (env_server/ray) and the SDK that finds it (clients/discovery.py).

In the Ray namespace `visenv`, a set NAME is the named actors `NAME/set` (its spec),
`NAME/server/<i>` and `NAME/gateway/<j>`; each server or gateway actor answers `info()`
with (among others) its "grpc" and "http" addresses and whether it is "draining".
"""

from __future__ import annotations

import re

NAMESPACE = "visenv"
SCHEME = "ray://"  # servers="ray://NAME" in the SDK
# lower-case letters, digits and '-': it also names each server, NAME-<i>, in session ids
# (and an address such as ray://10.0.0.1:10001, Ray Client's, is never a set's name)
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")


def check_name(name: str) -> str:
    """`name` if it can name a set, else ValueError saying what can."""
    if not NAME.match(name):
        raise ValueError(
            f"Ray set name {name!r}: 1 to 42 lower-case letters, digits and '-' (not at "
            "either end); the cluster's own address goes in RAY_ADDRESS, not here"
        )
    return name


def set_actor(name: str) -> str:
    return f"{name}/set"


def member(name: str, kind: str, index: int) -> str:
    """`kind` is "server" or "gateway"."""
    return f"{name}/{kind}/{index}"


def member_index(name: str, kind: str, actor_name: str) -> int | None:
    """The index of `actor_name` if it is a `kind` of set `name`, else None."""
    prefix = f"{name}/{kind}/"
    tail = actor_name[len(prefix) :] if actor_name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None
