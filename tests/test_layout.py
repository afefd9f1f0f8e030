"""Mechanical checks of the code's layout (issue 44), read from the files (ast, not text):

- no module of the server, the SDK or the wire layer is over `MAX_LINES` lines
  (generated protobuf code aside): a longer one holds more than one idea;
- one module opens gRPC channels (`grpc.insecure_channel`, `grpc.secure_channel` or their
  `grpc.aio` forms): the one gRPC client, which the SDK and the gateway share;
- the gateway's second gRPC client, `env_server/service/upstream.py`, is gone.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("env_server", "clients", "visenv")
MAX_LINES = 600
CHANNEL_CALLS = {
    f"{module}.{name}"
    for module in ("grpc", "grpc.aio")
    for name in ("insecure_channel", "secure_channel")
}


def sources() -> list[Path]:
    """The hand-written Python modules under FOLDERS (generated `*_pb2*.py` aside)."""
    return sorted(
        path
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if "_pb2" not in path.name
    )


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def over_limit(paths: list[Path], limit: int = MAX_LINES) -> list[str]:
    """'path: N lines' for each module longer than `limit` lines."""
    out = []
    for path in paths:
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out.append(f"{shown(path)}: {lines} lines")
    return out


def channel_calls(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of each call in `source` that opens a gRPC channel, however
    grpc was imported (`import grpc`, `import grpc.aio as aio`, `from grpc import aio`,
    `from grpc.aio import insecure_channel as connect`, ...)."""
    tree = ast.parse(source)
    names: dict[str, str] = {}  # a local name -> the dotted name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:  # `import grpc.aio` binds `grpc`
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        parts = []
        func = node.func
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id not in names:
            continue
        dotted = ".".join([names[func.id], *reversed(parts)])
        if dotted in CHANNEL_CALLS:
            found.append((node.lineno, dotted))
    return sorted(found)


def channel_openers(paths: list[Path]) -> list[str]:
    """'path:line dotted.name' for each call that opens a gRPC channel in `paths`."""
    out = []
    for path in paths:
        for line, dotted in channel_calls(path.read_text()):
            out.append(f"{shown(path)}:{line} {dotted}")
    return out


def test_no_module_is_over_the_line_limit():
    over = over_limit(sources())
    assert not over, f"modules over {MAX_LINES} lines:\n" + "\n".join(over)


def test_one_module_opens_grpc_channels():
    calls = channel_openers(sources())
    modules = sorted({call.split(":")[0] for call in calls})
    assert len(modules) == 1, (
        f"{len(modules)} modules open gRPC channels, not one (the one gRPC client):\n"
        + "\n".join(calls)
    )


def test_the_gateway_has_no_second_grpc_client():
    upstream = ROOT / "env_server" / "service" / "upstream.py"
    assert not upstream.exists(), f"{upstream.relative_to(ROOT)} is still there"


# ---- the checks can fail ------------------------------------------------------------------


def test_the_line_check_names_a_long_module(tmp_path):
    short, long = tmp_path / "short.py", tmp_path / "long.py"
    short.write_text("x = 1\n" * MAX_LINES)
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    assert over_limit([short, long]) == [f"{long}: {MAX_LINES + 1} lines"]


def test_the_channel_check_sees_every_import_form():
    source = """
import grpc
import grpc.aio as aio
from grpc import aio as grpc_aio
from grpc.aio import insecure_channel as connect
from grpc import secure_channel

grpc.insecure_channel("a")
grpc.aio.insecure_channel("b")
aio.secure_channel("c", None)
grpc_aio.insecure_channel("d")
connect("e")
secure_channel("f", None)
grpc.insecure_channel_credentials()
other.insecure_channel("g")
"""
    assert channel_calls(source) == [
        (8, "grpc.insecure_channel"),
        (9, "grpc.aio.insecure_channel"),
        (10, "grpc.aio.secure_channel"),
        (11, "grpc.aio.insecure_channel"),
        (12, "grpc.aio.insecure_channel"),
        (13, "grpc.secure_channel"),
    ]
