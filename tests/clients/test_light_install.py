"""`pip install visenv` is the client SDK alone; the server and the rest are extras.

Read from the code (ast, so that imports inside functions count too, as tests/test_layers.py
does) and pyproject.toml: the base dependencies are exactly what clients/, visenv/ and the
`visenv` command's module import; the server extra covers what the server imports. Then for
real: the SDK installed into a fresh venv with only its base dependencies (the main venv's
own copies of them and of what they require, so the test runs offline) plays a step against
a real server, and `visenv serve` there names the extra to install.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import venv
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import VisenvServer

ROOT = Path(__file__).resolve().parents[2]
OWN = {"visenv", "visenv_cli", "clients", "trainer", "env_server"}
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
# modules of the SDK that need more than the base install, and the extra that brings it
SDK_EXTRAS = {
    "clients/gym_env.py": "gym",
    "clients/verl_agent_loop.py": None,  # verl: the user's
    "clients/discovery.py": "ray",  # servers="ray://NAME" only
}
FAMILIES = {"svg": "svg", "navigation": "navigation", "primitive_skill": "primitive_skill"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(*extras: str) -> set[str]:
    """The distributions the base install plus these extras name (visenv[...] expanded)."""
    out, todo, seen = set(), [*PROJECT["dependencies"]], set()
    for extra in extras:
        todo += EXTRAS[extra]
    while todo:
        req = Requirement(todo.pop())
        if _norm(req.name) == _norm(PROJECT["name"]):
            todo += [r for e in req.extras - seen for r in EXTRAS[e]]
            seen |= req.extras
        else:
            out.add(_norm(req.name))
    return out


def imported(paths: list[Path], top_level_only: bool = False) -> set[str]:
    """Third-party top-level modules the files import."""
    found = set()
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body if top_level_only else ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in OWN and m not in sys.stdlib_module_names}


def distributions(modules: set[str]) -> dict[str, set[str]]:
    """Module -> the installed distributions that provide it (google: protobuf, ...)."""
    provided = importlib.metadata.packages_distributions()
    return {m: {_norm(d) for d in provided.get(m, [m])} for m in modules}


def sdk_files() -> list[Path]:
    files = [*(ROOT / "clients").rglob("*.py"), *(ROOT / "visenv").rglob("*.py")]
    return [f for f in files if str(f.relative_to(ROOT)) not in SDK_EXTRAS]


def sdk_modules() -> set[str]:
    # the command's module imports only typer at the top; its server and trainer commands
    # import those lazily and say which extra is missing
    return imported(sdk_files()) | imported([ROOT / "visenv_cli/__init__.py"], top_level_only=True)


def test_base_dependencies_are_what_the_sdk_imports():
    base = declared()
    needed = distributions(sdk_modules())
    missing = {m: d for m, d in needed.items() if not d & base}
    assert not missing, f"the SDK imports these, the base install lacks them: {missing}"
    unused = base - set().union(*needed.values())
    assert not unused, f"base dependencies the SDK never imports (an extra's?): {unused}"


def test_sdk_modules_outside_the_base_install_have_their_extra():
    for rel, extra in SDK_EXTRAS.items():
        if extra is None:
            continue
        needed = distributions(imported([ROOT / rel]))
        missing = {m: d for m, d in needed.items() if not d & declared(extra)}
        assert not missing, f"{rel} imports {missing}, not in visenv[{extra}]"


def test_the_server_extra_covers_the_server_and_each_family_pulls_it():
    envs = ROOT / "env_server" / "envs"
    server = [
        p
        for p in (ROOT / "env_server").rglob("*.py")
        if not any(envs / family in p.parents for family in FAMILIES)
        # the conformance suites and the test launcher: pytest, from the dev extra
        and ROOT / "env_server" / "testing" not in p.parents
        and ROOT / "env_server" / "ray" not in p.parents  # Ray actors: the ray extra
    ]
    # what the server extra brings, with what that requires (starlette comes with fastapi)
    allowed = _requirements_closure([*PROJECT["dependencies"], *EXTRAS["server"]])
    modules = imported(server) - {"cv2"}  # images.py falls back to Pillow without OpenCV
    missing = {m: d for m, d in distributions(modules).items() if not d & allowed}
    assert not missing, f"the server imports these, visenv[server] lacks them: {missing}"
    assert "opencv-python-headless" in declared("opencv")
    for extra in FAMILIES.values():
        assert declared("server") <= declared(extra), f"visenv[{extra}] must pull the server"


def test_importing_the_sdk_loads_no_server_package():
    code = (
        "import sys, clients, clients.eval, clients.openai_policy, visenv_cli; print(*sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    loaded = {m.split(".")[0] for m in out.stdout.split()}
    heavy = {"env_server", "trainer", "fastapi", "uvicorn", "gymnasium", "pygame", "scipy",
             "pydantic", "prometheus_client", "torch"}  # fmt: skip
    assert not loaded & heavy


def _requirements_closure(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements need, transitively (no extras)."""
    out: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _norm(req.name)
        if name in out:
            continue
        out.add(name)
        dist = importlib.metadata.distribution(req.name)
        todo += [Requirement(r) for r in dist.requires or []]
    return out


def test_a_client_only_install_plays_against_a_real_server(
    tmp_path: Path, visenv_server: VisenvServer
):
    # the project's wheel, built from a copy so the checkout gets no build/ or egg-info
    src = tmp_path / "src"
    for name in sorted(OWN):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    wheel = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path, src],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert wheel.returncode == 0, wheel.stderr
    # a fresh venv holding only the base dependencies and what they require
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    site = next(env_dir.glob("lib/python*/site-packages"))
    for name in _requirements_closure(PROJECT["dependencies"]):
        dist = importlib.metadata.distribution(name)
        for file in dist.files or []:
            if file.parts[0] == "..":  # scripts in bin/: not needed
                continue
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(Path(dist.locate_file(file)).resolve())
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = dict(capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    installed = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *tmp_path.glob("*.whl")],
        **run,
    )
    assert installed.returncode == 0, installed.stderr
    check = subprocess.run([py, "-m", "pip", "check"], **run)  # base requirements all met
    assert check.returncode == 0, check.stdout + check.stderr
    for module in ("fastapi", "gymnasium", "scipy", "pygame", "uvicorn", "prometheus_client"):
        assert not list(site.glob(f"{module}*")), f"{module} is in the client-only install"

    play = textwrap.dedent(f"""
        import sys
        from clients import EnvClient, SessionOptions
        with EnvClient({visenv_server.grpc!r}) as client:
            [reply] = client.create([SessionOptions(env="sokoban", seed=3, format="no_think")])
            [after] = client.step([reply.session_id], ["<answer>Left</answer>"])
        assert after.step_index == 1 and after.observation.images, after
        assert after.observation.images[0].to_array().ndim == 3
        assert not {{"env_server", "fastapi", "gymnasium"}} & set(sys.modules)
        print("played", after.reward)
    """)  # fmt: skip
    out = subprocess.run([py, "-c", play], **run)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("played")

    serve = subprocess.run([env_dir / "bin" / "visenv", "serve", "--port", "0"], **run)
    assert serve.returncode == 1, serve.stdout + serve.stderr
    assert "pip install 'visenv[server]'" in serve.stderr
