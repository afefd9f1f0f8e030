"""Session ids that say which server holds the session.

    s-3f9c0a1b2c3d4e5f.visenv-light-0.9a8b7c6d
      random key       node            boot

- node: the server's stable name (`VISENV_NODE_ID`; by default this host's name, which
  on Kubernetes is the pod's, stable under a StatefulSet). A DNS label: [a-z0-9-].
- boot: random per server process, so ids made before a restart are told apart from
  the restarted server's (those sessions are gone with the old process).
- key: 64 random bits, the part nobody can guess.

A gateway routes by (node, boot) alone, so any gateway replica, or one just restarted,
sends a request to the right upstream with no memory of its own. The id only *names*
a server: a gateway maps the name to an address it was configured with or discovered,
so a crafted id can never make it call an address of the client's choosing.
"""

from __future__ import annotations

import re
import secrets
import socket
from dataclasses import dataclass

NODE_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_ID = re.compile(r"^s-[0-9a-f]{16}\.([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)\.([0-9a-f]{8})$")


@dataclass(frozen=True)
class Origin:
    """The server process a session id names."""

    node: str
    boot: str

    @classmethod
    def here(cls, node: str | None = None) -> Origin:
        """This process: `node` (default: the host's name as a DNS label), a new boot."""
        return cls(node or default_node(), secrets.token_hex(4))

    def new_id(self) -> str:
        return f"s-{secrets.token_hex(8)}.{self.node}.{self.boot}"


def default_node() -> str:
    """The host's name as a DNS label: its first label, lower-cased, other characters '-'."""
    label = socket.gethostname().split(".")[0].lower()
    label = re.sub(r"[^a-z0-9-]", "-", label).strip("-")[:63].strip("-")
    return label or "visenv"


def origin_of(session_id: str) -> Origin | None:
    """The server an id names; None for anything not made by `Origin.new_id`."""
    match = _ID.match(session_id)
    return Origin(match[1], match[2]) if match else None
