"""`visenv ray up|status|scale|down`: visenv servers as actors on a Ray cluster
(env_server/ray; docs/ray.md), against --address, else RAY_ADDRESS, else the cluster this
machine is a node of. Ray and the server are imported only when a command runs.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

import typer

ray_app = typer.Typer(
    help="visenv servers as actors on a Ray cluster (the ray extra; docs/ray.md).",
    no_args_is_help=True,
    add_completion=False,
)

Name = Annotated[str, typer.Option("--name", help="The set's name (ray://NAME in the SDK).")]
Address = Annotated[
    str | None,
    typer.Option("--address", help="The Ray cluster (default: RAY_ADDRESS, else this machine's)."),
]
Json = Annotated[bool, typer.Option("--json", help="One JSON document instead of a table.")]


def _servers(address: str | None) -> Any:
    """env_server.ray.servers, joined to the cluster; a missing extra said plainly."""
    try:
        from env_server.ray import servers
    except ModuleNotFoundError as exc:
        _fail(
            f"visenv ray needs ray and the server (no module {exc.name!r}): pip install 'visenv[ray]'"
        )
    try:
        servers.connect(address)
    except ConnectionError as exc:
        _fail(f"no Ray cluster at {address or 'RAY_ADDRESS / this machine'}: {exc}")
    return servers


def _fail(message: str) -> NoReturn:
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise typer.Exit(1)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            _fail(f"{what} {value!r}: write KEY=VALUE")
        out[key] = val
    return out


def _table(name: str, rows: list[dict[str, Any]]) -> str:
    servers = [r for r in rows if r["kind"] == "server"]
    draining = sum(1 for r in servers if r.get("draining"))
    gateways = len(rows) - len(servers)
    lines = [
        f"set {name}: {len(servers)} server(s) ({len(servers) - draining} serving, "
        f"{draining} draining), {gateways} gateway(s)"
    ]
    head = ("KIND", "#", "NODE", "gRPC", "HTTP", "SESSIONS", "HEALTH", "DRAINING")
    table = [head]
    for r in rows:
        node = (r.get("ray_node") or "?")[:8]
        table.append(
            (
                r["kind"],
                str(r["index"]),
                f"{node} {r.get('ip', '')}".strip(),
                r.get("grpc") or "-",
                r.get("http") or "-",
                "-" if r.get("sessions") is None else str(r["sessions"]),
                str(r.get("health")),
                "yes" if r.get("draining") else "no",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    ]
    return "\n".join(lines)


def _show(servers: Any, name: str, as_json: bool) -> None:
    try:
        rows = servers.status(name)
    except servers.SetError as exc:
        _fail(str(exc))
    typer.echo(
        json.dumps({"name": name, "members": rows}, indent=1) if as_json else _table(name, rows)
    )


@ray_app.command()
def up(
    name: Name,
    servers_: Annotated[int, typer.Option("--servers", help="How many servers.")] = 1,
    cpus_per_server: Annotated[
        float, typer.Option(help="Ray CPUs each server holds (its workers: this many, >= 1).")
    ] = 1.0,
    workers: Annotated[
        int | None, typer.Option(help="Worker processes per server (default: its CPUs).")
    ] = None,
    envs: Annotated[
        str | None, typer.Option(help="Comma-separated environments (default: all available).")
    ] = None,
    gpus_per_server: Annotated[
        float, typer.Option(help="GPUs each server holds (ManiSkill).")
    ] = 0.0,
    resource: Annotated[
        list[str], typer.Option(help="A Ray custom resource each server holds, NAME=AMOUNT.")
    ] = [],  # noqa: B006 (typer reads the default, never mutates it)
    label: Annotated[
        list[str], typer.Option(help="A node label the servers' nodes must carry, KEY=VALUE.")
    ] = [],  # noqa: B006
    strategy: Annotated[str, typer.Option(help="SPREAD (over nodes) or DEFAULT.")] = "SPREAD",
    gateway: Annotated[
        bool, typer.Option("--gateway", help="Also a gateway over the set, for clients outside.")
    ] = False,
    serve_arg: Annotated[
        list[str], typer.Option(help="A further `visenv serve` flag, e.g. --serve-arg=--token=T.")
    ] = [],  # noqa: B006
    timeout: Annotated[float, typer.Option(help="Seconds for all servers to answer.")] = 600.0,
    address: Address = None,
    as_json: Json = False,
) -> None:
    """Start a set of NAME servers on the cluster, spread over its nodes; returns when all answer."""
    servers = _servers(address)
    try:
        spec = servers.SetSpec(
            name,
            cpus_per_server=cpus_per_server,
            workers=workers,
            envs=envs,
            gpus_per_server=gpus_per_server,
            resources={k: float(v) for k, v in _pairs(resource, "--resource").items()},
            label_selector=_pairs(label, "--label"),
            strategy=strategy.upper(),
            serve_args=list(serve_arg),
        )
        servers.up(spec, servers_, gateways=1 if gateway else 0, timeout=timeout)
    except (servers.SetError, ValueError) as exc:
        _fail(str(exc))
    _show(servers, name, as_json)


@ray_app.command()
def status(name: Name, address: Address = None, as_json: Json = False) -> None:
    """Each server's (and gateway's) node, address, sessions and health, as they answer now."""
    _show(_servers(address), name, as_json)


@ray_app.command()
def scale(
    name: Name,
    servers_: Annotated[int, typer.Option("--servers", help="How many serving servers.")],
    timeout: Annotated[float, typer.Option(help="Seconds for new servers to answer.")] = 600.0,
    address: Address = None,
    as_json: Json = False,
) -> None:
    """Add servers, or drain the newest (no new sessions; each stops after its last one).

    A drained server serves its open sessions to their end and stops when the last is
    closed (or reaped idle)."""
    servers = _servers(address)
    try:
        done = servers.scale(name, servers_, timeout=timeout)
    except servers.SetError as exc:
        _fail(str(exc))
    if not as_json:
        typer.echo(
            f"started {done['started'] or 'none'}; draining {done['drained'] or 'none'} "
            "(each stops when its last session ends)"
        )
    _show(servers, name, as_json)


@ray_app.command()
def down(name: Name, address: Address = None) -> None:
    """Stop every server and gateway of the set at once (open sessions end) and forget it."""
    servers = _servers(address)
    try:
        count = servers.down(name)
    except servers.SetError as exc:
        _fail(str(exc))
    typer.echo(f"set {name}: stopped {count} server(s) and gateway(s)")
