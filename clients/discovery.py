"""`servers="ray://NAME"`: the visenv servers of set NAME on the Ray cluster this process
runs in (or joins: RAY_ADDRESS, else the cluster on this machine), as `visenv ray up`
started them (env_server/ray). Ray is imported only here, and only when a client is
given such an address, so `pip install visenv` without ray works for everything else.

A verl driver or any Ray actor is connected already; its own namespace is left as it is
(the set's actors are looked up in the `visenv` namespace by name).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from visenv.ray_names import NAMESPACE, SCHEME, check_name, member_index

from .errors import Unavailable


@dataclass(frozen=True)
class Found:
    """One server of the set, as its actor describes itself."""

    address: str  # host:grpc_port
    draining: bool  # takes no new sessions; its open ones still go
    http: str | None = None  # http://host:port
    name: str = ""  # its actor's name, NAME/server/<i>


class NoServerAnswers(Unavailable):
    """The set has no server that answers now (none up, or all restarting)."""


def set_name(address: str) -> str | None:
    """NAME of "ray://NAME" (ValueError for a NAME no set can have), None for any other
    address."""
    return check_name(address[len(SCHEME) :]) if address.startswith(SCHEME) else None


_INIT = threading.Lock()  # clients on several threads join the cluster once


def _ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise Unavailable(
            "servers='ray://NAME' finds servers on a Ray cluster, and this install has no "
            "ray: pip install 'visenv[ray]' (or pip install ray)"
        ) from None
    with _INIT:
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS") or "auto"
            try:
                ray.init(
                    address=address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    # not Ray's warnings about the thread it joins from (the SDK reads the
                    # set in a worker thread): an SDK user cannot act on them
                    logging_level="ERROR",
                )
            except ConnectionError as exc:
                raise Unavailable(
                    f"servers='ray://NAME': no Ray cluster to join at {address!r} (set "
                    f"RAY_ADDRESS, or run on a node of the cluster): {exc}"
                ) from None
    return ray


def ray_servers(name: str, timeout: float = 10.0) -> list[Found]:
    """The servers of set `name` that answer within `timeout`, by address (blocking: call
    it in a thread from async code). A server Ray is restarting answers once it is back;
    one drained away is gone. Raises Unavailable when none answers."""
    ray = _ray()
    handles = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if (
            actor["namespace"] == NAMESPACE
            and member_index(name, "server", actor["name"]) is not None
        ):
            try:
                handles.append(ray.get_actor(actor["name"], namespace=NAMESPACE))
            except ValueError:  # gone since it was listed
                continue
    refs = [h.info.remote() for h in handles]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
    found = []
    for ref in ready:
        try:
            info = ray.get(ref)
        except ray.exceptions.RayActorError:  # died meanwhile: Ray is restarting it
            continue
        if info.get("grpc"):
            found.append(
                Found(
                    info["grpc"],
                    bool(info.get("draining")),
                    info.get("http"),
                    str(info.get("name", "")),
                )
            )
    if not found:
        raise NoServerAnswers(
            f"no server of Ray set {name!r} answers ({len(handles)} named in namespace "
            f"{NAMESPACE!r}): is it up (visenv ray status --name {name})?"
        )
    return sorted(found, key=lambda f: f.address)
