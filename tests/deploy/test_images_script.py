"""scripts/images.py's pieces that need no container engine (`make image-test` runs the rest)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("images_script", ROOT / "scripts" / "images.py")
images = importlib.util.module_from_spec(spec)
spec.loader.exec_module(images)


def test_the_build_gets_this_machines_pip_configuration(tmp_path, monkeypatch):
    wheels, index = tmp_path / "wheels", tmp_path / "mirror" / "simple"
    wheels.mkdir()
    index.mkdir(parents=True)
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {wheels}\nextra-index-url = file://{index}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)  # as in pip, PIP_* would win
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "77")
    monkeypatch.setattr(images, "STATE", tmp_path / "state")
    args = images._pip_mounts()
    mounts = [args[i + 1] for i in range(0, len(args), 2)]
    assert all(args[i] == "-v" for i in range(0, len(args), 2))
    assert f"{wheels}:{wheels}:ro" in mounts
    # a local index's pages link to files beside `simple/`: its parent goes in
    assert f"{index.parent}:{index.parent}:ro" in mounts
    merged = (tmp_path / "state" / "pip.conf").read_text()
    assert f"find-links = {wheels}" in merged and "default-timeout = 77" in merged
    assert f"{tmp_path / 'state' / 'pip.conf'}:/etc/pip.conf:ro" in mounts


def test_expected_frame_sizes_follow_the_config_defaults():
    def schema(**defaults):
        return {"properties": {k: {"default": v} for k, v in defaults.items()}}

    assert images.expected_side("sokoban", schema(dim_room=[6, 7], tile_size=16)) == (96, 112)
    assert images.expected_side("frozenlake", schema(size=4, image_size=None)) == (256, 256)
    assert images.expected_side("frozenlake", schema(size=4, image_size=100)) == (100, 100)
    assert images.expected_side("svg", schema(image_size=256)) == (256, 256)


def test_every_image_compose_pulls_has_a_stand_in():
    """compose.yaml's images that are not built here are the ones the script can stand in
    for when no registry answers (the base image, and HAProxy in front of the gateways)."""
    import yaml

    services = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    built = {image for image, _ in images.FAMILIES.values()}
    pulled = {s["image"] for s in services.values() if s["image"] not in built}
    assert pulled == {images.PROXY}
    assert images.PROXY_STAND_IN.startswith(f"FROM {images.BASE_FULL}\n")
    assert f"LABEL {images.STAND_IN_LABEL}=" in images.PROXY_STAND_IN
