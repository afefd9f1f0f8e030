"""The layering of DESIGN.md, read from the imports of every module (ast, so that imports
inside functions count too):

    visenv_cli  ->  trainer  ->  clients  ->  visenv (wire: generated code + wire/)
    visenv_cli  ->  env_server: api -> service -> envs, reasoning -> core  ->  visenv
                               service (the gateway) -> clients (its transport and router)

and no import cycle between modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("visenv", "visenv_cli", "clients", "trainer", "env_server")

# what each layer may import (besides itself, the standard library and third parties)
ALLOWED = {
    "visenv": set(),
    "env_server": set(),  # the bare package
    "clients": {"visenv"},
    "trainer": {"visenv", "clients"},
    "env_server.core": {"visenv"},
    "env_server.envs": {"visenv", "env_server.core"},
    "env_server.reasoning": {"visenv", "env_server.core"},
    # the gateway is a client of its upstreams: the SDK's gRPC transport and router
    "env_server.service": {"visenv", "clients", "env_server.core", "env_server.reasoning"},
    "env_server.api": {
        "visenv", "env_server.core", "env_server.reasoning", "env_server.service",
    },
    # the conformance suites drive environments and servers from outside
    "env_server.testing": {
        "visenv", "env_server.core", "env_server.reasoning", "env_server.service",
        "env_server.envs",
    },
    # visenv servers as Ray actors: each runs `visenv serve` through the one launcher
    "env_server.ray": {"visenv", "env_server.testing"},
    "visenv_cli": {"visenv", "clients", "trainer", "env_server"},
}  # fmt: skip


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of this repository that `name` imports (a from-import of a package
    counts the submodule when it is one)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from package import module` imports the module; `from module import name`
            # (or `from package import name`) imports that module or package
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(module: str) -> str:
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    raise AssertionError(f"{module} is in no layer")


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def test_every_import_goes_down_the_layers():
    wrong = []
    for module, targets in graph().items():
        own = layer_of(module)
        for target in targets:
            other = layer_of(target)
            if other == own or other.startswith(own + ".") or own.startswith(other + "."):
                continue
            if not any(other == a or other.startswith(a + ".") for a in ALLOWED[own]):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_imports_one_that_imports_it_back():
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    assert not cycles, cycles


def test_the_checker_sees_a_violation():
    """The rules above can fail: an env importing the service is caught."""
    own = layer_of("env_server.envs.sokoban.env")
    assert own == "env_server.envs"
    assert not any(
        "env_server.service" == a or "env_server.service".startswith(a + ".") for a in ALLOWED[own]
    )
