"""Build the family images and test them for real: `make images`, `make image-test`.

    python scripts/images.py build [FAMILY ...]     # default: light navigation primitive_skill
    python scripts/images.py test  [FAMILY ...] [--compose/--no-compose]

The engine is Docker when a Docker daemon answers, else podman (installed with apt-get
when missing and run as root, as scripts/setup.sh installs system packages). The
Dockerfiles are built unmodified, as a Docker user builds them. Where the official base
image python:3.11-slim-bookworm cannot be pulled (no registry reachable) a stand-in is
made from Debian's own packages (debootstrap) under the same name, and the build says so;
its differences from the official image are listed in docker/README.md.

`test` runs each image on loopback, waits for its own HEALTHCHECK, plays a default session
of every environment it serves (create, one step, the frame decoded at the size the env
declares), then brings up `envs` from the root compose.yaml (docker compose or
podman-compose; HAProxy in front of the gateway replicas, a stand-in from Debian's haproxy
where haproxy:3.0-alpine cannot be pulled) and plays every environment through its REST
and gRPC ports.
Everything it started is taken down, also on failure. A failure names the image, the step
and the container's last log lines.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from configparser import ConfigParser
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAMILIES = {  # family -> (image, environments it serves)
    "light": ("visenv-light:latest", ["sokoban", "frozenlake", "svg", "vicrit"]),
    "navigation": ("visenv-navigation:latest", ["navigation"]),
    "primitive_skill": ("visenv-primitive-skill:latest", ["primitive_skill"]),
}
BASE = "python:3.11-slim-bookworm"
BASE_FULL = "docker.io/library/" + BASE
STAND_IN_LABEL = "org.visenv.stand-in"
DEBIAN_MIRROR = os.environ.get("VISENV_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PODMAN_PACKAGES = [
    "podman",
    "buildah",
    "runc",
    "fuse-overlayfs",
    "slirp4netns",
    "uidmap",
    "debootstrap",
]
PROXY = "haproxy:3.0-alpine"  # docker/compose.yaml's `envs`
PROXY_FULL = "docker.io/library/" + PROXY
# the stand-in where PROXY cannot be pulled: like the official image, haproxy on PATH,
# /bin/sh, user haproxy, SIGUSR1 (soft stop) to stop
PROXY_STAND_IN = f"""FROM {BASE_FULL}
RUN apt-get update && apt-get install -y --no-install-recommends haproxy \\
    && rm -rf /var/lib/apt/lists/*
USER haproxy
STOPSIGNAL SIGUSR1
LABEL {STAND_IN_LABEL}=debian-bookworm-haproxy
"""
STATE = ROOT / ".images"  # generated engine config (ignored by git)
PROJECT = "visenv-image-test"  # compose project name used by `test`


class Failure(Exception):
    """A step failed: names the image, the step and the evidence (log lines)."""

    def __init__(self, image: str, step: str, detail: str) -> None:
        super().__init__(f"[{image}] {step}: {detail}")


def say(msg: str) -> None:
    print(f"images: {msg}", flush=True)


def run(
    *cmd: str,
    check: bool = True,
    capture: bool = False,
    env: dict | None = None,
    timeout: float | None = None,
    **kw,
) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, text=True, capture_output=capture, env=env, timeout=timeout, **kw)
    if check and out.returncode:
        tail = ((out.stdout or "") + (out.stderr or ""))[-3000:] if capture else ""
        raise subprocess.CalledProcessError(out.returncode, cmd, tail)
    return out


# ------------------------------------------------------------------------ the engine
def _docker_daemon() -> bool:
    if not shutil.which("docker"):
        return False
    return run("docker", "info", check=False, capture=True, timeout=30).returncode == 0


def engine() -> str:
    """ "docker" when its daemon answers, else "podman" (installed and configured here)."""
    if os.environ.get("VISENV_ENGINE"):
        return os.environ["VISENV_ENGINE"]
    if _docker_daemon():
        return "docker"
    missing = [
        p for p in PODMAN_PACKAGES if run("dpkg", "-s", p, check=False, capture=True).returncode
    ]
    if missing:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            sys.exit(f"images: no Docker daemon and no podman; install {' '.join(missing)}")
        say(f"no Docker daemon: installing {' '.join(missing)}")
        run("apt-get", "update", "-qq")
        run(
            "apt-get",
            "install",
            "-y",
            "-qq",
            *missing,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    _podman_config()
    return "podman"


def _podman_config() -> None:
    """A containers.conf of our own (CONTAINERS_CONF), the system one left alone: runc
    (crun fails on hybrid cgroups: "cgroups in hybrid mode not supported") and default
    ulimits within this machine's hard limits (podman's defaults exceed them here)."""
    import resource

    def hard(limit: int) -> int:
        value = resource.getrlimit(limit)[1]
        return 1048576 if value == resource.RLIM_INFINITY else value

    # nproc above 32768 is refused inside the sandbox here even under a higher hard limit
    nofile, nproc = hard(resource.RLIMIT_NOFILE), min(hard(resource.RLIMIT_NPROC), 32768)
    STATE.mkdir(exist_ok=True)
    conf = STATE / "containers.conf"
    conf.write_text(
        "# written by scripts/images.py\n[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        '[engine]\nruntime = "runc"\n'
    )
    os.environ["CONTAINERS_CONF"] = str(conf)


def compose_cmd(eng: str) -> list[str]:
    if eng == "docker":
        return ["docker", "compose"]
    tool = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
    if not Path(tool).exists():
        say("installing podman-compose (pip)")
        run(sys.executable, "-m", "pip", "install", "-q", "podman-compose>=1.3")
    return [tool]


# ------------------------------------------------------------------- the base image
def _local_or_pulled(eng: str, name: str) -> bool:
    """Whether image `name` (docker.io/library/...) is here or could be pulled; says so
    when the one here is our stand-in."""
    have = run(eng, "image", "inspect", name, check=False, capture=True)
    if have.returncode == 0:
        labels = json.loads(have.stdout)[0].get("Config", {}).get("Labels") or {}
        if labels.get(STAND_IN_LABEL):
            say(f"{name}: the local stand-in (no registry reachable), see docker/README.md")
        return True
    pulled = run(eng, "pull", name, check=False, capture=True, timeout=180)
    if pulled.returncode == 0:
        return True
    say(f"cannot pull {name} ({pulled.stderr.strip().splitlines()[-1:]})")
    return False


def ensure_base(eng: str) -> None:
    """The official base when it can be pulled, else the stand-in (said so, labelled)."""
    if not _local_or_pulled(eng, BASE_FULL):
        say(
            f"making a stand-in {BASE} from Debian bookworm packages (debootstrap), "
            "see docker/README.md"
        )
        make_stand_in(eng)


def ensure_proxy(eng: str) -> None:
    """The compose file's HAProxy in front of the gateways (`envs`): the official image
    when it can be pulled, else a stand-in under its name from Debian bookworm's haproxy
    package (2.6, not 3.0; see docker/README.md), built on the base image."""
    if _local_or_pulled(eng, PROXY_FULL):
        return
    ensure_base(eng)
    say(f"making a stand-in {PROXY}: Debian bookworm's haproxy on {BASE}, see docker/README.md")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="visenv-proxy-") as tmp:
        (Path(tmp) / "Containerfile").write_text(PROXY_STAND_IN)
        extra = ["--pull=never", "--format", "docker"] if eng == "podman" else []
        out = run(eng, "build", *extra, "-t", PROXY_FULL, tmp, check=False)
    if out.returncode:
        raise Failure(PROXY, "stand-in build", f"{eng} build exited {out.returncode} (log above)")
    version = run(eng, "run", "--rm", PROXY_FULL, "haproxy", "-v", capture=True).stdout
    say(f"stand-in {PROXY} made in {time.monotonic() - start:.0f} s: {version.splitlines()[0]}")


SOURCES = f"""Types: deb
URIs: {DEBIAN_MIRROR}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


DPKG_SLIM = """path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""
APT_CLEAN = """DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
"""


def make_stand_in(eng: str) -> None:
    if not shutil.which("debootstrap"):
        run("apt-get", "install", "-y", "-qq", "debootstrap")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="visenv-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(
            "debootstrap",
            "--variant=minbase",
            "--include=ca-certificates,netbase,tzdata,python3.11,python3.11-venv,python3-pip",
            "bookworm",
            str(rootfs),
            DEBIAN_MIRROR,
            capture=True,
        )
        # as in the official image: `python`/`pip` on PATH, deb822 sources, no apt lists,
        # and debian:bookworm-slim's dpkg/apt settings (no docs, man pages or translations;
        # apt deletes the .deb files it downloaded)
        (rootfs / "usr/local/bin/python").symlink_to("/usr/bin/python3")
        (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
        (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(SOURCES)
        (rootfs / "etc/dpkg/dpkg.cfg.d/docker").write_text(DPKG_SLIM)
        (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(APT_CLEAN)
        for pattern in (
            "usr/share/doc/*/*",
            "usr/share/man/*",
            "usr/share/info/*",
            "usr/share/locale/*",
            "usr/share/groff/*",
            "usr/share/lintian/*",
        ):
            for p in rootfs.glob(pattern):
                if p.name not in ("copyright", "locale.alias"):
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        for junk in ("var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "var/log"):
            for p in (rootfs / junk).glob("*"):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        tar = subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
        )
        changes = [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            'CMD ["python3"]',
            f"LABEL {STAND_IN_LABEL}=debootstrap-bookworm-python3.11",
        ]
        args = [a for c in changes for a in ("--change", c)]
        run(eng, "import", *args, "-", BASE_FULL, stdin=tar.stdout, capture=True)
        tar.wait()
    say(f"stand-in {BASE} made in {time.monotonic() - start:.0f} s")


# ------------------------------------------------------------------------ building
def _pip_mounts() -> list[str]:
    """podman build -v arguments giving RUN steps this machine's pip configuration and
    certificate authorities (a mirror, local wheels, a proxy CA), read-only, so that the
    Dockerfiles need no change. Environment PIP_* settings go in as a generated pip.conf."""
    files = [
        Path(p)
        for p in (
            "/etc/xdg/pip/pip.conf",
            "/etc/pip.conf",
            os.path.expanduser("~/.config/pip/pip.conf"),
            os.path.expanduser("~/.pip/pip.conf"),
            os.environ.get("PIP_CONFIG_FILE", ""),
        )
        if p and Path(p).is_file()
    ]
    merged = ConfigParser(interpolation=None)
    for f in files:
        merged.read(f)
    if not merged.has_section("global"):
        merged.add_section("global")
    for key, value in os.environ.items():
        if key.startswith("PIP_") and key != "PIP_CONFIG_FILE":
            merged["global"][key[4:].lower().replace("_", "-")] = value
    paths = {"/etc/ssl/certs/ca-certificates.crt"}
    for section in merged.sections():
        for value in merged[section].values():
            for word in value.split():
                word = word.removeprefix("file://")
                if word.startswith("/") and Path(word).exists():
                    path = Path(word)  # a local index's pages link to files beside it
                    paths.add(str(path.parent if path.name == "simple" else path))
    STATE.mkdir(exist_ok=True)
    conf = STATE / "pip.conf"
    buf = io.StringIO()
    merged.write(buf)
    conf.write_text(buf.getvalue())
    mounts = [f"{conf}:/etc/pip.conf:ro"]
    mounts += [f"{p}:{p}:ro" for p in sorted(paths) if Path(p).exists()]
    return [a for m in mounts for a in ("-v", m)]


TORCH_INDEX = "https://download.pytorch.org/whl/cpu"  # Dockerfile.primitive_skill's default


def _torch_args(given: dict[str, str]) -> dict[str, str]:
    """TORCH_SPEC as `make setup` takes it; TORCH_INDEX_URL empty (pip's configuration, as
    scripts/setup.sh installs torch) where the Dockerfile's default index is unreachable."""
    import httpx

    out = {"TORCH_SPEC": os.environ["TORCH_SPEC"]} if os.environ.get("TORCH_SPEC") else {}
    if "TORCH_INDEX_URL" not in given:
        try:
            httpx.head(TORCH_INDEX + "/", timeout=10)
        except httpx.HTTPError as exc:
            say(
                f"{TORCH_INDEX} unreachable ({type(exc).__name__}): torch comes from pip's "
                "own configuration (TORCH_INDEX_URL=)"
            )
            out["TORCH_INDEX_URL"] = ""
    return out


def build(eng: str, families: list[str], build_args: dict[str, str]) -> dict[str, float]:
    ensure_base(eng)
    times = {}
    for family in families:
        image = FAMILIES[family][0]
        cmd = [eng, "build", "-f", f"docker/Dockerfile.{family}", "-t", image]
        args = dict(build_args)
        if family == "primitive_skill":
            args.update(_torch_args(args))
        cmd += [a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")]
        if eng == "podman":  # HEALTHCHECK needs the docker format; the base is local
            cmd += ["--pull=never", "--format", "docker", *_pip_mounts()]
        say(f"building {image}: {' '.join(cmd[1:])}")
        start = time.monotonic()
        out = run(*cmd, ".", cwd=ROOT, check=False)
        times[family] = time.monotonic() - start
        if out.returncode:
            raise Failure(image, "build", f"{eng} build exited {out.returncode} (log above)")
        size = run(eng, "image", "inspect", image, "--format", "{{.Size}}", capture=True)
        say(f"built {image} in {times[family]:.0f} s, {int(size.stdout) / 1e6:.0f} MB")
    return times


# ------------------------------------------------------------------------ testing
ANSWERS = {  # one well-formed no_think answer per environment (its one step)
    "sokoban": "<answer>Left</answer>",
    "frozenlake": "<answer>Left</answer>",
    "svg": '<answer><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10">'
    '<rect width="5" height="5" fill="red"/></svg></answer>',
    "vicrit": "<answer>box</answer>",
    "navigation": "<answer>moveahead</answer>",
    "primitive_skill": "<answer>pick(0,0,0)</answer>",
}


def expected_side(env: str, schema: dict) -> tuple[int, int]:
    """(height, width) of a default session's frame, from the env's config schema defaults."""
    props = schema.get("properties", {})
    if env == "sokoban":
        rows, cols = props["dim_room"]["default"]
        return rows * props["tile_size"]["default"], cols * props["tile_size"]["default"]
    if env == "frozenlake" and props["image_size"].get("default") is None:
        return (props["size"]["default"] * 64,) * 2  # gymnasium's 64 px per cell
    return (props["image_size"]["default"],) * 2


def play(address: str, transport: str, envs: list[str]) -> dict[str, float]:
    """One default session of each env (create, one step, frames checked); seconds each."""
    import numpy as np
    from PIL import Image

    from clients import EnvClient, SessionOptions

    took = {}
    with EnvClient(address, transport=transport, timeout=300, retries=0) as client:
        specs = {s.name: s for s in client.list_envs()}
        for env in envs:
            step = f"{env} over {transport}"
            if env not in specs or not specs[env].available:
                reason = specs[env].unavailable_reason if env in specs else "not listed"
                raise Failure(address, step, f"env not available: {reason}")
            side = expected_side(env, specs[env].config_schema)
            start = time.monotonic()
            (made,) = client.create([SessionOptions(env, seed=0, format="no_think")])
            (stepped,) = client.step([made.session_id], [ANSWERS[env]])
            png = client.frame([made.session_id])[0]
            took[env] = time.monotonic() - start
            client.close([made.session_id])
            images = [i for r in (made, stepped) for i in r.observation.images]
            if not images:
                raise Failure(address, step, "no image in the create or step reply")
            shapes = {i.to_array().shape for i in images}
            shapes.add(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).shape)
            if shapes != {(*side, 3)}:
                raise Failure(address, step, f"frames decode as {shapes}, expected {(*side, 3)}")
            if stepped.step_index != 1:
                raise Failure(address, step, f"step_index {stepped.step_index} after one step")
    return took


def logs(eng: str, container: str, lines: int = 20) -> str:
    out = run(eng, "logs", "--tail", str(lines), container, check=False, capture=True)
    return "\n    ".join(["log:", *(out.stdout + out.stderr).strip().splitlines()[-lines:]])


def wait_healthy(eng: str, container: str, image: str, limit: float) -> float:
    """Seconds from start until the image's own HEALTHCHECK passes (run by hand: podman
    without systemd runs no healthcheck timers)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        state = run(
            eng, "inspect", container, "--format", "{{.State.Status}}", check=False, capture=True
        ).stdout.strip()
        if state in ("exited", "dead", ""):
            raise Failure(
                image, "start", f"container {state or 'gone'}\n    {logs(eng, container)}"
            )
        if eng == "podman":
            ok = run("podman", "healthcheck", "run", container, check=False, capture=True)
            if ok.returncode == 0:
                return time.monotonic() - start
        else:
            health = run(
                "docker", "inspect", container, "--format", "{{.State.Health.Status}}", capture=True
            ).stdout.strip()
            if health == "healthy":
                return time.monotonic() - start
        time.sleep(1)
    raise Failure(image, "health", f"not healthy after {limit:.0f} s\n    {logs(eng, container)}")


def port_of(eng: str, container: str, port: int) -> str:
    out = run(eng, "port", container, str(port), capture=True).stdout.split()[0]
    return out.replace("0.0.0.0", "127.0.0.1")


@contextmanager
def container(eng: str, image: str, name: str):
    run(eng, "rm", "-f", name, check=False, capture=True)
    ports = ["-p", "127.0.0.1::8000", "-p", "127.0.0.1::50051"]
    started = run(eng, "run", "-d", "--name", name, *ports, image, check=False, capture=True)
    if started.returncode:
        run(eng, "rm", "-f", name, check=False, capture=True)
        raise Failure(image, "run", started.stderr.strip()[-2000:])
    try:
        yield name
    finally:
        run(eng, "rm", "-f", "-t", "5", name, check=False, capture=True)


def test_image(eng: str, family: str) -> dict:
    image, envs = FAMILIES[family]
    name = f"visenv-test-{family.replace('_', '-')}"
    with container(eng, image, name):
        healthy = wait_healthy(eng, name, image, limit=300)
        say(f"{image}: healthy {healthy:.1f} s after run")
        try:
            first = play(port_of(eng, name, 8000), "http", envs)
            again = play(port_of(eng, name, 50051), "grpc", envs)
        except Failure as exc:
            raise Failure(image, str(exc), logs(eng, name)) from None
        except Exception as exc:  # an SDK error: name the image and show the server's log
            raise Failure(image, f"session: {type(exc).__name__}: {exc}", logs(eng, name)) from exc
    for env in envs:
        say(
            f"{image}: {env} first session {first[env]:.2f} s (REST), next {again[env]:.2f} s (gRPC)"
        )
    return {"healthy_s": healthy, "first_session_s": first, "second_session_s": again}


def test_compose(eng: str, families: list[str]) -> dict:
    """`envs` from the root compose.yaml with the given families behind the gateway."""
    compose = [*compose_cmd(eng), "-p", PROJECT, "-f", str(ROOT / "compose.yaml")]
    # loopback, on two free ports (podman 4.3 refuses host port 0)
    env = {
        **os.environ,
        "VISENV_HTTP_PORT": f"127.0.0.1:{free_port()}",
        "VISENV_GRPC_PORT": f"127.0.0.1:{free_port()}",
    }
    # --no-deps: only the families given (the gateway serves the ones that answer). Nor
    # do we count on depends_on's service_healthy (podman < 4.6 ignores it): the gateway
    # asks its upstreams again every few seconds, and we wait until it lists every env.
    # Every service but the families not asked for (`envs` and whatever fronts it).
    import yaml

    declared = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    services = [s for s in declared if s not in FAMILIES or s in families]
    ensure_proxy(eng)
    down = [*compose, "down", "-t", "5"]
    run(*down, check=False, capture=True, env=env, cwd=ROOT)
    start = time.monotonic()
    up = run(
        *compose,
        "up",
        "-d",
        "--no-build",
        "--no-deps",
        *services,
        check=False,
        capture=True,
        env=env,
        cwd=ROOT,
    )
    try:
        if up.returncode:
            raise Failure("compose", "up", up.stdout[-2000:] + up.stderr[-2000:])
        replicas = declared["gateway"].get("deploy", {}).get("replicas", 1)
        got = _compose_containers(eng, "gateway")
        if len(got) != replicas:
            raise Failure("compose", "up", f"gateway replicas {got}, compose.yaml asks {replicas}")
        gateway = _compose_container(eng, "envs")  # HAProxy in front of the gateways
        http, grpc = port_of(eng, gateway, 8000), port_of(eng, gateway, 50051)
        want = sorted(e for f in families for e in FAMILIES[f][1])
        _wait_gateway(eng, gateway, http, want, replicas, limit=300)
        ready = time.monotonic() - start
        say(
            f"compose: envs ({PROXY}) in front of {replicas} gateway replicas lists "
            f"{', '.join(want)} {ready:.1f} s after up"
        )
        try:
            rest = play(http, "http", want)
            grpc_took = play(grpc, "grpc", want)
        except Failure as exc:
            raise Failure("compose envs", str(exc), logs(eng, gateway)) from None
        except Exception as exc:
            raise Failure(
                "compose envs", f"session: {type(exc).__name__}: {exc}", logs(eng, gateway)
            ) from exc
        for env_name in want:
            say(
                f"compose: {env_name} through the gateway {rest[env_name]:.2f} s (REST), "
                f"{grpc_took[env_name]:.2f} s (gRPC)"
            )
        return {"ready_s": ready, "rest_s": rest, "grpc_s": grpc_took}
    finally:
        run(*down, check=False, capture=True, env=env, cwd=ROOT)
        left = run(
            eng,
            "ps",
            "-a",
            "--filter",
            f"label=com.docker.compose.project={PROJECT}",
            "--format",
            "{{.Names}}",
            check=False,
            capture=True,
        ).stdout.split()
        if left:
            run(eng, "rm", "-f", *left, check=False, capture=True)
            raise Failure("compose", "down", f"containers left running: {left}")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _compose_container(eng: str, service: str) -> str:
    out = _compose_containers(eng, service)
    if not out:
        raise Failure("compose", "up", f"no container for service {service}")
    return out[0]


def _compose_containers(eng: str, service: str) -> list[str]:
    return run(
        eng,
        "ps",
        "-a",
        "--filter",
        f"label=com.docker.compose.project={PROJECT}",
        "--filter",
        f"label=com.docker.compose.service={service}",
        "--format",
        "{{.Names}}",
        check=False,
        capture=True,
    ).stdout.split()


def _wait_gateway(
    eng: str, gateway: str, http: str, want: list[str], replicas: int, limit: float
) -> None:
    """Until `envs` answers `want` on 2 x replicas health checks in a row: HAProxy takes
    each connection to the next replica, and every replica must list every env."""
    import httpx

    start, seen, in_a_row = time.monotonic(), None, 0
    while time.monotonic() - start < limit:
        state = run(
            eng, "inspect", gateway, "--format", "{{.State.Status}}", check=False, capture=True
        ).stdout.strip()
        if state in ("exited", "dead", ""):
            detail = f"`envs` container {state or 'gone'}\n    {logs(eng, gateway)}"
            raise Failure(f"compose envs ({PROXY})", "start", detail)
        try:
            seen = httpx.get(f"http://{http}/health", timeout=5).json().get("envs")
        except (httpx.HTTPError, ValueError):
            seen = None
        in_a_row = in_a_row + 1 if seen == want else 0
        if in_a_row >= 2 * replicas:
            return
        time.sleep(0.2 if in_a_row else 2)
    replicas = _compose_containers(eng, "gateway")
    raise Failure(
        f"compose envs ({PROXY})",
        "health",
        f"gateway lists {seen}, want {want}\n    "
        + "\n    ".join(f"{c} {logs(eng, c)}" for c in [gateway, *replicas]),
    )


def sizes(eng: str, families: list[str]) -> None:
    """Image size and its biggest layers (history), for the report."""
    for family in families:
        image = FAMILIES[family][0]
        total = run(eng, "image", "inspect", image, "--format", "{{.Size}}", capture=True)
        say(f"{image}: {int(total.stdout) / 1e6:.0f} MB; biggest layers:")
        hist = run(
            eng,
            "history",
            "--no-trunc",
            "--format",
            "{{.Size}}\t{{.CreatedBy}}",
            image,
            capture=True,
        ).stdout.splitlines()
        rows = []
        for line in hist:
            size, _, by = line.partition("\t")
            rows.append((_bytes(size), by.strip()))
        for size, by in sorted(rows, reverse=True)[:5]:
            by = " ".join(by.split())[:110]
            say(f"  {size / 1e6:8.1f} MB  {by}")


def _bytes(text: str) -> float:
    m = re.match(r"([\d.]+)\s*([kMG]?B)", text.strip())
    if not m:
        return 0.0
    return float(m[1]) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[m[2]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "test", "sizes"])
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--no-compose", action="store_true", help="test: skip the compose step")
    parser.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    unknown = set(args.families) - set(FAMILIES)
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}; known: {list(FAMILIES)}")
    eng = engine()
    start = time.monotonic()
    try:
        if args.command == "build":
            build(eng, args.families, dict(a.split("=", 1) for a in args.build_arg))
            sizes(eng, args.families)
        elif args.command == "sizes":
            sizes(eng, args.families)
        else:
            for family in args.families:
                test_image(eng, family)
            if not args.no_compose:
                test_compose(eng, args.families)
    except Failure as exc:
        sys.exit(f"images: FAILED {exc}")
    say(f"{args.command} done in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
