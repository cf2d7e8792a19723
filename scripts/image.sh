#!/usr/bin/env bash
# The image of Dockerfile built and run on a machine of ours, with or without a container
# registry (docs/operator-guide.md, "The image"; issue 38).
#
#   bash scripts/image.sh build                                   # the image's name on the last line
#   bash scripts/image.sh run [podman run options] IMAGE COMMAND... # a container of it, removed after
#   bash scripts/image.sh engine ARGS...                          # podman (or docker) as run/build see it
#
# build: localhost/storage-migrator:<version of pyproject.toml>. The base is python:3.11-slim
# where a registry answers; where none does, a Debian bookworm root made from Debian's packages
# with mmdebstrap (python3 3.11, python3-venv), imported as localhost/storage-migrator-base:<hash of
# how it is made>, and given to the same Dockerfile as its BASE build argument. An unchanged build
# takes seconds: the base is made once per recipe, and the engine's layer cache does the rest
# (the dependencies' layer changes only with uv.lock). Progress goes to stderr, the name to stdout:
#   IMAGE=$(bash scripts/image.sh build)
#
# The engine: docker where an engine answers (`docker info`: a client alone is not enough), else
# podman, installed from Debian's packages when missing (apt-get, as root). Podman runs with a
# configuration of its own, written below into STATE, never the machine's
# (/etc/containers/containers.conf, /var/lib/containers): it holds this kind of machine's quirks.
#
# Settings (environment):
#   STORAGE_MIGRATOR_IMAGE_ENGINE  podman or docker (default: docker if its engine answers, else podman)
#   STORAGE_MIGRATOR_IMAGE_BASE    the base image, or `debian` for the mmdebstrap root (default: the
#                                  registry's python:3.11-slim if a registry answers, else `debian`)
#   STORAGE_MIGRATOR_IMAGE_STATE   podman's storage and configuration, and the build's lock
#                                  (default /var/tmp/storage-migrator-image)
set -euo pipefail
cd "$(dirname "$0")/.."

#: Outside the checkout, so that every clone and worktree of this machine (and CI's fresh clone,
#: which runs on the same machine) shares one layer cache: a store per clone would make each of
#: them build cold, and `git clean -dfx` would throw away hundreds of MB of cache. /var/tmp
#: survives reboots (a cache worth keeping); nothing there is the machine's own configuration.
STATE=${STORAGE_MIGRATOR_IMAGE_STATE:-/var/tmp/storage-migrator-image}
REGISTRY_BASE=docker.io/library/python:3.11-slim
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
IMAGE=localhost/storage-migrator:$VERSION
#: The host's CA bundle: where the network goes through a TLS proxy (these machines), pip and uv
#: in the build need it. Mounted for the build only; never in a layer.
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

log() { echo "image.sh: [${SECONDS} s] $*" >&2; }

apt_install() {
    log "installing $* from Debian's packages"
    # Waits for another apt-get of this machine (another clone's bootstrap) rather than failing.
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >&2
}

docker_answers() {
    command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1
}

choose_engine() {
    ENGINE=${STORAGE_MIGRATOR_IMAGE_ENGINE:-}
    if [ -z "$ENGINE" ]; then
        if docker_answers; then ENGINE=docker; else ENGINE=podman; fi
    fi
    case "$ENGINE" in
        docker)
            docker_answers || { log "docker's engine does not answer (docker info); unset STORAGE_MIGRATOR_IMAGE_ENGINE to use podman"; exit 1; }
            ;;
        podman)
            # runc: this machine's crun refuses its hybrid cgroups (below).
            if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
                apt_install podman runc
            fi
            podman_configuration
            ;;
        *)
            log "STORAGE_MIGRATOR_IMAGE_ENGINE is podman or docker, not '$ENGINE'"
            exit 2
            ;;
    esac
}

# Podman's configuration, private to this script (CONTAINERS_CONF and CONTAINERS_STORAGE_CONF
# point podman at it; the machine's files stay untouched).
podman_configuration() {
    mkdir -p "$STATE"
    write_if_changed "$STATE/containers.conf" <<'EOF'
# Written by scripts/image.sh (issue 38): podman as this script runs it, never the machine's own.
[containers]
# Root here may not raise its rlimits past the hard limits the machine gives it (nofile 20000),
# and podman's defaults ask for more (nofile 1048576): the container would not start.
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
# No container network plugin is installed (netavark, CNI: podman's recommends, left out), and
# nothing here needs one: containers share the host's network, where kubesim and Prefect listen.
netns = "host"

[engine]
# crun (podman's first choice) refuses this machine's hybrid cgroups (v1 controllers with a v2
# tree beside them); runc runs on them.
runtime = "runc"
# No systemd runs here (it is not PID 1): podman manages cgroups itself.
cgroup_manager = "cgroupfs"
# No journald either: events go to a file in the run root.
events_logger = "file"
EOF
    write_if_changed "$STATE/storage.conf" <<EOF
# Written by scripts/image.sh (issue 38): podman's images and layers for this project only.
[storage]
driver = "overlay"
graphroot = "$STATE/storage"
runroot = "$STATE/run"
EOF
    export CONTAINERS_CONF="$STATE/containers.conf" CONTAINERS_STORAGE_CONF="$STATE/storage.conf"
}

write_if_changed() {  # FILE < content: replaced only when different, atomically
    local tmp
    tmp=$(mktemp "$1.XXXXXX")
    cat >"$tmp"
    if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

registry_answers() {  # any HTTP answer counts (401 without credentials is the usual one)
    python3 - <<'EOF' 2>/dev/null
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen("https://registry-1.docker.io/v2/", timeout=3)
except urllib.error.HTTPError:
    pass
except Exception:
    sys.exit(1)
EOF
}

#: The Debian root: the essential packages, Python 3.11 and what the Dockerfile's RUNs call
#: (python3-venv for pip in the build's uv stage, passwd for useradd, ca-certificates as in
#: python:3.11-slim). merged /usr by the hook (bookworm's usrmerge package would pull in perl);
#: no recommends, no docs, man pages or translations (as Debian's slim images).
MMDEBSTRAP_ARGS=(
    --variant=essential
    --include=python3,python3-venv,ca-certificates,passwd
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --aptopt='Apt::Install-Recommends "false"'
    --dpkgopt=force-unsafe-io
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    bookworm
)
MMDEBSTRAP_MIRRORS=(
    "deb http://deb.debian.org/debian bookworm main"
    "deb http://deb.debian.org/debian bookworm-updates main"
    "deb http://deb.debian.org/debian-security bookworm-security main"
)

image_exists() {
    if [ "$ENGINE" = docker ]; then docker image inspect "$1" >/dev/null 2>&1; else podman image exists "$1"; fi
}

debian_base() {  # prints the base's name, made and imported when missing
    local hash name tmp
    hash=$(printf '%s\n' "${MMDEBSTRAP_ARGS[@]}" "${MMDEBSTRAP_MIRRORS[@]}" | sha256sum | cut -c1-16)
    name=localhost/storage-migrator-base:bookworm-$hash
    if image_exists "$name"; then
        log "base $name (made before)"
    else
        command -v mmdebstrap >/dev/null 2>&1 || apt_install mmdebstrap
        # The root is made in memory where there is some: dpkg's many fsyncs on this machine's disk
        # took three times as long (242 s against 69 s).
        tmp=$(mktemp -d "$( [ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/storage-migrator-base.XXXXXX")
        # shellcheck disable=SC2064
        trap "rm -rf '$tmp'" EXIT
        log "making the base from Debian's packages (mmdebstrap)"
        TMPDIR=$tmp mmdebstrap --quiet "${MMDEBSTRAP_ARGS[@]}" "$tmp/root.tar" "${MMDEBSTRAP_MIRRORS[@]}" >&2
        "$ENGINE" import "$tmp/root.tar" "$name" >&2
        rm -rf "$tmp"
        trap - EXIT
        log "base $name imported"
    fi
    echo "$name"
}

choose_base() {
    BASE=${STORAGE_MIGRATOR_IMAGE_BASE:-}
    if [ -z "$BASE" ]; then
        if registry_answers; then BASE=$REGISTRY_BASE; else
            log "no container registry answers: the base is made from Debian's packages"
            BASE=debian
        fi
    fi
    if [ "$BASE" = debian ]; then BASE=$(debian_base); fi
}

build() {
    choose_engine
    mkdir -p "$STATE"
    # One build at a time on this machine (another clone's, a test's in the background): the
    # second waits, then finds the first one's layers.
    exec 9>"$STATE/build.lock"
    flock 9
    choose_base
    local args=(--build-arg "BASE=$BASE" --tag "$IMAGE" --network host)
    if [ "$ENGINE" = podman ]; then
        if [ -r "$CA_BUNDLE" ]; then
            args+=(--volume "$CA_BUNDLE:/run/build-ca.crt:ro"
                   --build-arg PIP_CERT=/run/build-ca.crt --build-arg SSL_CERT_FILE=/run/build-ca.crt)
        fi
        # uv's cache of this machine (scripts/bootstrap.sh filled it from the same uv.lock): a first
        # build downloads only what the checkout's own environment did not. Mounted, never in a layer.
        local uv_cache
        uv_cache=$(uv cache dir 2>/dev/null || true)
        if [ -n "$uv_cache" ] && mkdir -p "$uv_cache"; then
            args+=(--volume "$uv_cache:/root/.cache/uv" --build-arg UV_NO_CACHE=0)
        fi
    fi
    log "building $IMAGE with $ENGINE on $BASE"
    "$ENGINE" build "${args[@]}" . >&2
    # The images of earlier builds that no tag names any more (this build's cache is not among them).
    "$ENGINE" image prune --force >/dev/null
    log "built $IMAGE"
    echo "$IMAGE"
}

run() {
    choose_engine
    exec "$ENGINE" run --rm "$@"
}

engine() {
    choose_engine
    exec "$ENGINE" "$@"
}

case "${1:-}" in
    build) shift; [ "$#" -eq 0 ] || { log "build takes no arguments"; exit 2; }; build ;;
    run) shift; [ "$#" -gt 0 ] || { log "usage: scripts/image.sh run [options] IMAGE COMMAND..."; exit 2; }; run "$@" ;;
    engine) shift; engine "$@" ;;
    *)
        echo "usage: bash scripts/image.sh build | run [podman run options] IMAGE COMMAND... | engine ARGS..." >&2
        exit 2
        ;;
esac
