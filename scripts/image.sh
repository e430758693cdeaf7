#!/usr/bin/env bash
# `make image`: the server image, built by podman from the Dockerfile as it stands.
#
#   scripts/image.sh [NAME]      (default pvwire:0.1.0, what k8s/base/deployment.yaml runs)
#
# The base images are the public ones (NODE_IMAGE, PYTHON_IMAGE: a site sets its own registry's
# names here) when podman has or can pull them; otherwise stand-ins are made from Debian's
# packages first (scripts/base_images.sh). Prints the build time and the image's size.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/scripts/containers.conf}

IMAGE=${1:-pvwire:0.1.0}
NODE_IMAGE=${NODE_IMAGE:-docker.io/library/node:22-trixie-slim}
PYTHON_IMAGE=${PYTHON_IMAGE:-docker.io/library/python:3.13-slim-trixie}

log() { printf '%s image: %s\n' "$(date +%T)" "$*" >&2; }

base() {  # the public image $1 if podman has it or can pull it, else a local stand-in ($2)
    if podman image exists "$1" || podman pull -q "$1" >/dev/null 2>&1; then
        echo "$1"
    else
        log "$1 cannot be pulled: using a stand-in made from Debian's packages"
        scripts/base_images.sh "$2"
    fi
}

start=$SECONDS
node=$(base "$NODE_IMAGE" node)
python=$(base "$PYTHON_IMAGE" python)
log "bases ready in $((SECONDS - start)) s: $node, $python"
built=$SECONDS
# docker format: OCI images have no HEALTHCHECK, and podman would drop the Dockerfile's.
podman build --format docker --build-arg NODE_IMAGE="$node" --build-arg PYTHON_IMAGE="$python" \
    -t "$IMAGE" . >&2
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
log "$IMAGE built in $((SECONDS - built)) s ($((SECONDS - start)) s in all), $((size / 1000000)) MB"
