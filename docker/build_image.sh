#!/usr/bin/env bash
# Build the self-contained step image spogw:latest from docker/Dockerfile with no registry (see docker/README.md):
#   1. local/bookworm:base          debootstrap --variant=minbase bookworm + docker import (needs root and a
#                                   reachable Debian mirror; skipped when the image exists)
#   2. local/bookworm-python:3.11   + python3.11, python3-pip, python3-venv, `python` on PATH (skipped when it exists)
#   3. docker/wheels/               the torch 2.13.0 CPU wheel and the built llama-server (spogw runtime install), copied from
#                                   this host (pip's find-links / local indexes / wheel cache) when found (the
#                                   Dockerfile falls back to the torch CPU index and a source build without them),
#                                   and the CA bundle the host's pip trusts (used in the build stage only)
#   4. spogw:latest                 docker build --network host (pip reaches PyPI through the host's network),
#                                   context = the files the Dockerfile copies (not .venv, assets, ...), SRC = this repo
# Starts `dockerd --storage-driver=vfs` (as root) when no engine answers, and leaves it running (the step
# containers need it). The build stage is kept as local/spogw-build:latest (the layer cache for a rebuild after a
# code change; with the vfs driver every layer is a full copy, ~15 GB in all): --drop-build-stage removes it.
# Usage: docker/build_image.sh [--rebuild-base] [--no-cache] [--drop-build-stage]
# Environment: SPOGW_IMAGE (default spogw:latest), DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${SPOGW_IMAGE:-spogw:latest}
BASE=local/bookworm:base
PYBASE=local/bookworm-python:3.11
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHEELS=$REPO/docker/wheels
REBUILD_BASE=0
DROP_BUILD=0
BUILD_FLAGS=()
for a in "$@"; do
    case $a in
        --rebuild-base) REBUILD_BASE=1 ;;
        --no-cache) BUILD_FLAGS+=(--no-cache) ;;
        --drop-build-stage) DROP_BUILD=1 ;;
        *) echo "usage: $0 [--rebuild-base] [--no-cache] [--drop-build-stage]" >&2; exit 2 ;;
    esac
done
say() { printf '[build_image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
T0=$(date +%s)

# 0. an engine
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || { echo "no Docker engine answers; start one as root: dockerd --storage-driver=vfs &" >&2; exit 1; }
    command -v dockerd >/dev/null || { say "installing docker.io"; apt-get install -y docker.io; }
    say "starting dockerd --storage-driver=vfs (left running; log /tmp/spogw-dockerd.log)"
    setsid dockerd --storage-driver=vfs >/tmp/spogw-dockerd.log 2>&1 < /dev/null &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not come up: see /tmp/spogw-dockerd.log" >&2; exit 1; }
fi

# 1. the Debian base, debootstrapped here
if [ "$REBUILD_BASE" = 1 ] || ! have_image "$BASE"; then
    [ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }
    command -v debootstrap >/dev/null || { say "installing debootstrap"; apt-get install -y debootstrap; }
    root=$(mktemp -d /tmp/spogw-bookworm.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    say "debootstrap --variant=minbase bookworm $root $MIRROR"
    debootstrap --variant=minbase bookworm "$root" "$MIRROR" >&2
    # the image is a root file system, not a booted system: no caches or logs from the bootstrap
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
    say "docker import -> $BASE"
    tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    rm -rf "$root"; trap - EXIT
    REBUILD_BASE=1  # the python layer sits on it
else
    say "$BASE exists (--rebuild-base to make it again)"
fi

# 2. python3.11 from bookworm itself
if [ "$REBUILD_BASE" = 1 ] || ! have_image "$PYBASE"; then
    say "building $PYBASE"
    docker build --network host -t "$PYBASE" - >&2 <<EOF
FROM $BASE
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
        python3.11 python3-pip python3-venv ca-certificates \\
    && ln -s /usr/bin/python3 /usr/local/bin/python && rm -rf /var/lib/apt/lists/* && python --version
CMD ["python"]
EOF
else
    say "$PYBASE exists"
fi

# 3. stage the wheels this host already has (the Dockerfile takes them before any index)
mkdir -p "$WHEELS"
stage() {  # stage GLOB: the first wheel matching GLOB in pip's local sources on this host
    local glob=$1 f=""
    if ls "$WHEELS"/$glob >/dev/null 2>&1; then say "staged already: $(cd "$WHEELS" && ls $glob | head -1)"; return; fi
    local dirs=(/opt/wheels /opt/pypi /opt/pypi-more "${PIP_FIND_LINKS:-/nonexistent}" "${XDG_CACHE_HOME:-$HOME/.cache}/pip/wheels")
    for d in "${dirs[@]}"; do
        [ -d "$d" ] || continue
        f=$(find -L "$d" -name "$glob" -type f 2>/dev/null | head -1)
        [ -n "$f" ] && break
    done
    if [ -n "$f" ]; then
        say "staging $f"; cp "$f" "$WHEELS/"
    else
        say "no local $glob: the Dockerfile falls back to an index / a source build"
    fi
}
stage 'torch-2.13.0+cpu-cp311-cp311-*linux*x86_64.whl'
# the CA bundle this host's pip trusts (a TLS-intercepting proxy in front of PyPI needs it); build stage only
cert=${PIP_CERT:-$( { pip config list 2>/dev/null || true; } | sed -n "s/^global\.cert='\(.*\)'$/\1/p" | head -1)}
cert=${cert:-/etc/ssl/certs/ca-certificates.crt}
if [ -f "$cert" ]; then cmp -s "$cert" "$WHEELS/ca-certificates.crt" || { say "staging pip's CA bundle $cert"; cp "$cert" "$WHEELS/ca-certificates.crt"; }; fi
# the embedded executor's llama-server as `spogw runtime install` built it here (portable flags), at its tag
rt_bin=$(python -c 'from spogw_dagster.executors.llama_runtime import find_runtime; print(find_runtime().binary)' 2>/dev/null || true)
if [ -n "$rt_bin" ] && [ -x "$rt_bin" ]; then
    rt_dir=$(dirname "$(dirname "$rt_bin")"); rm -rf "$WHEELS/llama-runtime"; mkdir -p "$WHEELS/llama-runtime"
    say "staging $rt_dir"; cp -a "$rt_dir" "$WHEELS/llama-runtime/"
else
    say "no built llama-server (spogw runtime install): the Dockerfile builds one"
fi

# 4. the image; the context is only what the Dockerfile copies (plus the staged wheels), from the working tree
context() {
    tar -C "$REPO" -c --exclude=__pycache__ --exclude='*.pyc' \
        pyproject.toml README.md workspace.yaml spogw_dagster sandbox docker/Dockerfile docker/wheels
}
CTX=$(mktemp /tmp/spogw-context.XXXXXX.tar)
trap 'rm -f "$CTX"' EXIT
context >"$CTX"  # one snapshot of the working tree for both builds
build() {  # build [ARGS...]: docker build of docker/Dockerfile for this repository
    docker build --network host "${BUILD_FLAGS[@]}" -f docker/Dockerfile --build-arg BASE="$PYBASE" \
        --build-arg SRC="$REPO" "$@" - <"$CTX" >&2
}
say "docker build --target build -> local/spogw-build:latest (SRC=$REPO)"
build --target build -t local/spogw-build:latest
say "docker build -> $IMAGE"
build -t "$IMAGE"
if [ "$DROP_BUILD" = 1 ]; then say "removing local/spogw-build:latest"; docker rmi local/spogw-build:latest >/dev/null; fi
say "built $IMAGE in $(( $(date +%s) - T0 )) s: $(docker image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.2f GB", $1/1e9}')"
say "run the loop with it: SPOGW_STEP_IMAGE=$IMAGE python -m spogw_dagster.pipeline.runs.container_steps run --profile ci"
