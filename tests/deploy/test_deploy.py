"""Containers, compose and Kubernetes, checked without building an image.

The images are built and run for real by `make image-test` (scripts/images.py; .ci/run
does the light family), which takes minutes. Here, quickly: the compose files are
validated against the compose specification's schema, the Dockerfiles with hadolint, the
manifests against Kubernetes' schemas; and the exact commands the images and compose
services run (their ENV, ENTRYPOINT/CMD, HEALTHCHECK) are run outside containers, on
loopback.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from env_server.testing.launcher import launch_server

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent
DOCKERFILES = sorted(DOCKER.glob("Dockerfile.*"))
FAMILIES = {"light": "sokoban,frozenlake,svg,vicrit", "navigation": "navigation",
            "primitive_skill": "primitive_skill"}  # fmt: skip


def _tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing: `make setup` installs it (dev extra)"
    return str(path)


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------- static validation
def test_compose_files_follow_the_compose_specification():
    files = ["compose.yaml", "docker/compose.yaml", "docker/compose.gpu.yaml"]
    out = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", *files)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfiles_pass_hadolint():
    assert {p.name for p in DOCKERFILES} == {f"Dockerfile.{f}" for f in FAMILIES}
    out = _run(_tool("hadolint"), "--failure-threshold", "info", *map(str, DOCKERFILES))
    assert out.returncode == 0, out.stdout + out.stderr


def test_kubernetes_manifests_are_valid():
    out = _run(_tool("kubernetes-validate"), "--strict", "docker/k8s/visenv.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    docs = [d for d in yaml.safe_load_all((DOCKER / "k8s" / "visenv.yaml").read_text()) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for family in ("light", "navigation", "primitive-skill"):
        assert ("StatefulSet", f"visenv-{family}") in kinds
        assert ("Service", f"visenv-{family}") in kinds
    assert ("Deployment", "visenv-envs") in kinds and ("Service", "visenv-envs") in kinds
    # the gateway keeps no session state: two replicas, one kept up through drains
    (gateway,) = [
        d for d in docs if (d["kind"], d["metadata"]["name"]) == ("Deployment", "visenv-envs")
    ]
    assert gateway["spec"]["replicas"] >= 2 and ("PodDisruptionBudget", "visenv-envs") in kinds
    for doc in docs:
        if doc["kind"] in ("StatefulSet", "Deployment"):
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            assert container["readinessProbe"]["httpGet"]["path"] == "/health"
            assert container["livenessProbe"]["grpc"]["port"] == 50051
            assert container["resources"]["requests"]["memory"]


def test_compose_shape():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == set(FAMILIES) | {"envs", "gateway"}
    for family in FAMILIES:
        service = services[family]
        assert "ports" not in service, "families must scale (--scale): no fixed host ports"
        assert service["restart"] == "unless-stopped" and service["healthcheck"]["test"]
        assert service["environment"]["VISENV_ENVS"] == FAMILIES[family]
    envs = services["envs"]
    assert {p.split(":")[-1] for p in envs["ports"]} == {"8000", "50051"}
    assert all(dep["condition"] == "service_healthy" for dep in envs["depends_on"].values())
    assert services["gateway"]["deploy"]["replicas"] >= 2 and "ports" not in services["gateway"]
    gpu = yaml.safe_load((DOCKER / "compose.gpu.yaml").read_text())["services"]
    for family in ("navigation", "primitive_skill"):
        (device,) = gpu[family]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    # the build contexts are relative to the repository root, where the root file includes
    # this one (podman-compose resolves them there whatever project_directory says)
    root = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert root["include"] == [{"path": "docker/compose.yaml", "project_directory": "."}]
    for family in FAMILIES:
        assert services[family]["build"]["context"] == "."
        assert (ROOT / services[family]["build"]["dockerfile"]).is_file()


# ---------------------------------------------------------------- the images' own commands
def _dockerfile(path: Path) -> dict:
    """ENV, ENTRYPOINT + CMD and the HEALTHCHECK command of the final stage."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    final = text.split("\nFROM ")[-1]
    env: dict[str, str] = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                env[key] = value
    exec_form = {k: yaml.safe_load(v) for k, v in re.findall(r"^(ENTRYPOINT|CMD) (\[.*\])$",
                                                            final, re.M)}  # fmt: skip
    health = re.search(r"^HEALTHCHECK .*? CMD (\[.*\])$", final, re.M)
    return {"env": env, "command": exec_form["ENTRYPOINT"] + exec_form["CMD"],
            "health": yaml.safe_load(health[1])}  # fmt: skip


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.suffix[1:])
def test_image_command_serves_and_passes_its_healthcheck(dockerfile):
    image = _dockerfile(dockerfile)
    assert image["command"] == ["visenv", "serve"]
    env = {k: v for k, v in image["env"].items() if k.startswith("VISENV_")}
    assert env["VISENV_HOST"] == "0.0.0.0" and env["VISENV_PORT"] == "8000"
    # here: loopback and free ports instead of the container's 0.0.0.0:8000
    env.update(VISENV_HOST="127.0.0.1", VISENV_WORKERS="1")
    server = launch_server(workers=None, envs=None, extra_env=env, timeout=240)
    try:
        health = httpx.get(server.url + "/health", timeout=10).json()
        assert health["envs"] == sorted(env["VISENV_ENVS"].split(","))
        listed = httpx.get(server.url + "/v1/envs", timeout=10).json()["envs"]
        for spec in listed:
            if spec["enabled"]:
                assert spec["available"], spec["unavailable_reason"]
        port = server.url.rsplit(":", 1)[1]
        check = subprocess.run(
            [sys.executable if a == "python" else a for a in image["health"]],
            env={**os.environ, **image["env"], "VISENV_PORT": port},
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert check.returncode == 0, check.stderr
    finally:
        server.stop()
    check = subprocess.run([sys.executable if a == "python" else a for a in image["health"]],
                           env={**os.environ, "VISENV_PORT": port}, capture_output=True,
                           timeout=30)  # fmt: skip
    assert check.returncode != 0, "the healthcheck must fail once the server is gone"


def test_compose_envs_command_fronts_the_families():
    """The gateway's command (the replicas behind `envs`), with the light family behind it,
    on loopback."""
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    command = services["gateway"]["command"]
    assert command[0] == "serve" and all(a.startswith("--upstream=") for a in command[1:])
    light = launch_server(workers=1, envs=services["light"]["environment"]["VISENV_ENVS"])
    try:
        # compose's service names resolve to the family containers; here, to the one server
        upstreams = [a.replace("light:50051", light.grpc).split("=", 1)[1]
                     for a in command[1:] if a.startswith("--upstream=light:")]  # fmt: skip
        gateway = launch_server(workers=None, envs=None, upstreams=upstreams)
        try:
            health = httpx.get(gateway.url + "/health", timeout=10).json()
            assert health["role"] == "gateway"
            assert health["envs"] == ["frozenlake", "sokoban", "svg", "vicrit"]
            made = httpx.post(gateway.url + "/v1/sessions", json={"env": "svg"}, timeout=60)
            assert made.status_code == 200, made.text
        finally:
            gateway.stop()
    finally:
        light.stop()
