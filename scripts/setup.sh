#!/usr/bin/env bash
# Installs everything visenv needs, idempotently, on a fresh Debian/Ubuntu machine:
#   1. system libraries (as root: cairo for SVG, Mesa EGL for MiniWorld, Mesa >= 24.3
#      lavapipe Vulkan for ManiSkill3) — skipped with a warning when not root;
#   2. a virtual environment in $VENV with torch (CPU build, installed first so that
#      no other package pulls a multi-GB CUDA build), then visenv and its extras.
# Variables: PYTHON (python3), VENV (.venv), EXTRAS (server,dev,svg,navigation,ai2thor,primitive_skill,trainer,ray),
#            TORCH_SPEC (torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-server,dev,svg,navigation,ai2thor,primitive_skill,trainer,ray}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

SYSTEM_PACKAGES=(libcairo2 libegl1 libgl1 libgl1-mesa-dri libglu1-mesa chromium chromium-driver)

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    missing=()
    for pkg in "${SYSTEM_PACKAGES[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "setup: installing system packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    fi
    if [[ ",$EXTRAS," == *",primitive_skill,"* ]] && [ -f scripts/install_vulkan.sh ]; then
        bash scripts/install_vulkan.sh
    fi
else
    echo "setup: not root (or no apt-get): skipping system packages ${SYSTEM_PACKAGES[*]} and Vulkan;" \
         "install them yourself for the svg, navigation and primitive_skill environments" >&2
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q -e ".[${EXTRAS}]"
echo "setup: done ($VENV, extras: $EXTRAS)"
