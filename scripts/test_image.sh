#!/usr/bin/env bash
# Builds the CPU variant of the Dockerfile with podman and tests the image (docs/deploy.md):
#   1. a Debian 12 base made here, since no registry is reachable: mmdebstrap builds a bookworm
#      rootfs from the machine's own apt sources (cached as a tarball), `podman import` makes it
#      localhost/debian:12;
#   2. `podman build --pull=never --build-arg BASE=localhost/debian:12` (ccache in a build cache
#      mount, so a rebuild after a source change recompiles only what changed);
#   3. tests/image/test_image.py runs the image on stories260K, waits for its HEALTHCHECK, drives
#      it with the openai and grpcio clients and stops it with SIGTERM (drain, exit 0).
# Installs podman, runc and mmdebstrap with apt-get when missing; runs as root.
# Environment: ARBOR_IMAGE (tag, localhost/arbor:cpu), ARBOR_JOBS (compile jobs in the build,
# default the machine's cores), ARBOR_SHARED_DIR (../shared), XDG_CACHE_HOME (~/.cache: the
# rootfs tarball and the podman config live in its arbor/ folder).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
START=$(date +%s)
IMAGE="${ARBOR_IMAGE:-localhost/arbor:cpu}"
BASE=localhost/debian:12
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/arbor"
mkdir -p "$CACHE"
step() { echo "[test_image] $(( $(date +%s) - START ))s: $*"; }

missing=()
for p in podman runc mmdebstrap; do command -v "$p" >/dev/null || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null
fi
bash scripts/setup_python.sh

# runc, not crun (which failed on these machines' cgroup v1 hierarchy); cgroupfs and file events
# (no systemd); open files and processes at 4096: podman's default open-files limit (1048576) is
# above the host's hard limit, and runc then fails ("error setting rlimit type 7").
export CONTAINERS_CONF="$CACHE/containers.conf"
cat > "$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF

# The base: the rootfs tarball is keyed on the Debian apt sources it was made from (Debian's
# deb822 file, else sources.list); the imported image carries the key as a label, so a change of
# mirror makes both again.
SOURCES=/etc/apt/sources.list.d/debian.sources
[ -f "$SOURCES" ] || SOURCES=/etc/apt/sources.list
KEY=$(sha256sum "$SOURCES" | cut -c1-12)
ROOTFS="$CACHE/debian-12-rootfs-$KEY.tar"
if [ ! -f "$ROOTFS" ]; then
  step "mmdebstrap bookworm from $SOURCES -> $ROOTFS"
  # The mirror serves a dated snapshot whose Release files are past their Valid-Until; the
  # option is kept in the rootfs (/etc/apt/apt.conf.d/99mmdebstrap) for the image build's apt.
  mmdebstrap --quiet --variant=minbase --format=tar --aptopt='Acquire::Check-Valid-Until "false"' \
    bookworm "$ROOTFS.tmp" "$SOURCES"
  mv "$ROOTFS.tmp" "$ROOTFS"
fi
imported=$(podman image inspect --format '{{index .Labels "org.arbor.rootfs"}}' "$BASE" \
  2>/dev/null || true)
if [ "$imported" != "$KEY" ]; then
  step "podman import $ROOTFS -> $BASE"
  podman import --quiet --change "LABEL org.arbor.rootfs=$KEY" "$ROOTFS" "$BASE" >/dev/null
fi

# The build stage gets its own tag so that its layers (the apt install above all) stay cached
# when the prune below removes the images a new build has replaced.
step "podman build $IMAGE"
BUILD_ARGS=(--pull=never --format docker --build-arg "BASE=$BASE")
[ -n "${ARBOR_JOBS:-}" ] && BUILD_ARGS+=(--build-arg "JOBS=$ARBOR_JOBS")
podman build "${BUILD_ARGS[@]}" --target build -t "${IMAGE%:*}-build:${IMAGE##*:}" -f Dockerfile .
podman build "${BUILD_ARGS[@]}" -t "$IMAGE" -f Dockerfile .
podman image prune -f >/dev/null
step "image $(podman image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=iec) ($IMAGE)"

step "tests/image/test_image.py"
ARBOR_IMAGE="$IMAGE" ARBOR_SHARED_DIR="${ARBOR_SHARED_DIR:-$ROOT/../shared}" ARBOR_REPO="$ROOT" \
  python3 tests/image/test_image.py -v
step "done"
